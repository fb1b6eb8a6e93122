#!/usr/bin/env python3
"""PyTorch/timm side of scripts/bench-vit: training-step throughput of a timm ViT with AdamW on
synthetic data, eager fp32, eager bf16 autocast and torch.compile bf16. One JSON line each."""
import argparse, json, time

import timm
import torch

p = argparse.ArgumentParser()
p.add_argument("--model", default="vit_base_patch16_224")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--modes", default="eager-fp32,eager-bf16,compile-bf16")
a = p.parse_args()
dev = "cuda"
x = torch.randn(a.batch, 3, 224, 224, device=dev)
y = torch.arange(a.batch, device=dev) % 1000
for mode in a.modes.split(","):
    torch.manual_seed(0)
    model = timm.create_model(a.model, num_classes=1000).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    fwd = torch.compile(model) if mode.startswith("compile") else model
    bf16 = mode.endswith("bf16")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    ips = a.batch * a.steps / secs
    print(json.dumps({"impl": f"pytorch {mode}", "model": a.model, "batch": a.batch,
                      "img_per_s": round(ips, 1), "step_ms": round(1e3 * secs / a.steps, 1),
                      "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "torch": torch.__version__}), flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()
