#!/usr/bin/env python3
"""PyTorch/timm side of scripts/bench-vit: training-step throughput of a timm ViT with AdamW on
synthetic data, eager fp32, eager bf16 autocast and torch.compile bf16. One JSON line each.
Under torchrun with several processes: DistributedDataParallel (NCCL), batch per GPU, total img/s
printed by rank 0. --clip and --label-smoothing make the step do what vit_train's does (AdamW,
global-norm clipping, label smoothing). --kernel-profile FILE: torch.profiler's per-kernel CUDA time
table of each mode's steps (CUPTI through kineto) written to FILE.<mode>.txt. With NVML (the
driver's libnvidia-ml.so.1, through ctypes) each row also has this GPU's joules per image, mean
power and mean SM clock over the timed steps (as scripts/vit-train-synthetic reports for ours)."""
import argparse, ctypes, json, os, time

import timm
import torch

p = argparse.ArgumentParser()
p.add_argument("--model", default="vit_base_patch16_224")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--modes", default="eager-fp32,eager-bf16,compile-bf16")
p.add_argument("--clip", type=float, default=0.0)
p.add_argument("--label-smoothing", type=float, default=0.0)
p.add_argument("--kernel-profile", default="")
a = p.parse_args()
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
dev = "cuda"


class Nvml:
    """This process's GPU through NVML (matched by PCI bus id): energy (mJ), SM clock (MHz)."""

    def __init__(self):
        self.lib = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            bus = torch.cuda.get_device_properties(torch.cuda.current_device())
            pci = "%08x:%02x:%02x.0" % (bus.pci_domain_id, bus.pci_bus_id, bus.pci_device_id)
            self.handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByPciBusId_v2(pci.encode(), ctypes.byref(self.handle)) == 0:
                self.lib = lib
        except (OSError, AttributeError):
            self.lib = None

    def energy_mj(self):
        v = ctypes.c_ulonglong()
        ok = self.lib and self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle,
                                                                       ctypes.byref(v)) == 0
        return float(v.value) if ok else None

    def sm_mhz(self):
        v = ctypes.c_uint()
        ok = self.lib and self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(v)) == 0
        return v.value if ok else None


nvml = Nvml()
x = torch.randn(a.batch, 3, 224, 224, device=dev)
y = torch.arange(a.batch, device=dev) % 1000
for mode in a.modes.split(","):
    torch.manual_seed(0)
    model = timm.create_model(a.model, num_classes=1000).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    fwd = torch.compile(net) if mode.startswith("compile") else net
    bf16 = mode.endswith("bf16")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(fwd(x), y, label_smoothing=a.label_smoothing)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    e0, clocks = nvml.energy_mj(), []
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
        if e0 is not None:
            clocks.append(nvml.sm_mhz())
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    e1 = nvml.energy_mj()
    ips = a.batch * world * a.steps / secs
    name = f"pytorch {mode}" + (f" ddpx{world}" if world > 1 else "")
    if a.clip > 0 or a.label_smoothing > 0:
        name += f" clip {a.clip:g} ls {a.label_smoothing:g}"
    if a.kernel_profile and rank == 0:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        with open(f"{a.kernel_profile}.{mode}.txt", "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=60,
                                              max_name_column_width=100))
    if rank == 0:
        row = {"impl": name, "gpus": world, "model": a.model, "batch": a.batch,
               "img_per_s": round(ips, 1), "step_ms": round(1e3 * secs / a.steps, 1),
               "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
               "torch": torch.__version__}
        if e0 is not None and e1 is not None:
            row["j_per_img"] = round((e1 - e0) / 1000 / (a.batch * a.steps), 4)
            row["power_w"] = round((e1 - e0) / 1000 / secs, 1)
            row["sm_mhz"] = round(sum(c for c in clocks if c) / max(1, len(clocks)))
        print(json.dumps(row), flush=True)
    del model, opt, fwd, net
    torch.cuda.empty_cache()
if world > 1:
    torch.distributed.destroy_process_group()
