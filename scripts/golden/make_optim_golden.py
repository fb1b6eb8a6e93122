#!/usr/bin/env python3
"""Golden data for the optimizer tests (tests/optim/test_optim_golden.cpp).

Two parameters (w [6, 5] with weight decay, b [5] without), a fixed gradient per step, and the
parameters after each of 4 steps of: SGD, SGD with momentum, SGD Nesterov, Adam (L2 decay), AdamW,
and timm's Lamb (NVIDIA FusedLAMB behaviour, no internal grad clipping). Float32 on the CPU:

    python3 scripts/golden/make_optim_golden.py tests/data/optim_golden.bin
"""
import sys

import timm.optim
import torch

import goldenio

STEPS = 4
g = torch.Generator().manual_seed(1)
w0 = torch.randn(6, 5, generator=g)
b0 = torch.randn(5, generator=g)
grads = [(torch.randn(6, 5, generator=g), torch.randn(5, generator=g)) for _ in range(STEPS)]

out = {"init.w": w0, "init.b": b0}
for t, (gw, gb) in enumerate(grads):
    out[f"grad{t}.w"] = gw
    out[f"grad{t}.b"] = gb


def make(name, params):
    decay, no_decay = [params[0]], [params[1]]
    if name == "sgd":
        return torch.optim.SGD([{"params": decay, "weight_decay": 0.01},
                                {"params": no_decay, "weight_decay": 0.0}], lr=0.1)
    if name == "sgd_momentum":
        return torch.optim.SGD([{"params": decay, "weight_decay": 0.01},
                                {"params": no_decay, "weight_decay": 0.0}], lr=0.1, momentum=0.9)
    if name == "sgd_nesterov":
        return torch.optim.SGD([{"params": decay, "weight_decay": 0.01},
                                {"params": no_decay, "weight_decay": 0.0}], lr=0.1, momentum=0.9,
                               nesterov=True)
    if name == "adam":
        return torch.optim.Adam([{"params": decay, "weight_decay": 0.01},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=0.01,
                                betas=(0.9, 0.999), eps=1e-8)
    if name == "adamw":
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=0.01,
                                 betas=(0.9, 0.999), eps=1e-8)
    if name == "lamb":
        return timm.optim.Lamb([{"params": decay, "weight_decay": 0.05},
                                {"params": no_decay, "weight_decay": 0.0}], lr=0.01,
                               betas=(0.9, 0.999), eps=1e-6, max_grad_norm=None)
    raise ValueError(name)


for name in ["sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw", "lamb"]:
    w = w0.clone().requires_grad_(True)
    b = b0.clone().requires_grad_(True)
    opt = make(name, [w, b])
    for t, (gw, gb) in enumerate(grads):
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        out[f"{name}.step{t}.w"] = w.detach().clone()
        out[f"{name}.step{t}.b"] = b.detach().clone()

goldenio.write(sys.argv[1] if len(sys.argv) > 1 else "tests/data/optim_golden.bin", out)
print("torch", torch.__version__, "timm", timm.__version__, "tensors", len(out))
