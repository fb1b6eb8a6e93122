#!/usr/bin/env python3
"""Golden data for the ViT parity test (tests/nn/test_golden.cpp).

Builds a timm VisionTransformer (img 32, patch 8, dim 64, depth 2, heads 4, 10 classes), fixes its
weights and a batch, and writes inputs, weights, logits, the label-smoothed loss, every parameter
gradient and the losses of three AdamW steps (timm's weight-decay groups) to
tests/data/vit_golden.bin. Float32 on the CPU. Needs torch and timm (the GPU hosts have both):

    python3 scripts/golden/make_vit_golden.py tests/data/vit_golden.bin
"""
import sys

import numpy as np
import timm
import timm.optim
import torch

import goldenio

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
cfg = dict(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=64, depth=2,
           num_heads=4, mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0, drop_path_rate=0.0)
model = timm.models.vision_transformer.VisionTransformer(**cfg).float()
# Non-trivial norms and biases so their gradients are exercised.
with torch.no_grad():
    for n, p in model.named_parameters():
        if "norm" in n or n.endswith(".bias"):
            p.add_(0.1 * torch.randn_like(p))
    model.cls_token.normal_(std=0.02)
model.train()
B, smoothing = 4, 0.1
images = torch.randn(B, 3, 32, 32)
labels = torch.tensor([3, 0, 9, 3], dtype=torch.int32)
crit = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)

out = {}
out["config.ints"] = np.array([32, 8, 3, 10, 64, 2, 4, 256], dtype=np.int32)
out["config.label_smoothing"] = np.array([smoothing], dtype=np.float32)
out["input.images"] = images
out["input.labels"] = labels
for n, p in model.named_parameters():
    out["param." + n] = p.detach().clone()
logits = model(images)
loss = crit(logits, labels.long())
loss.backward()
out["output.logits"] = logits
out["output.loss"] = loss.reshape(1)
for n, p in model.named_parameters():
    out["grad." + n] = p.grad.detach().clone()

# Three AdamW steps on the same batch, no decay for biases, norms, tokens and pos_embed.
groups = timm.optim.param_groups_weight_decay(model, 0.05, model.no_weight_decay())
opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
losses = []
for step in range(3):
    opt.zero_grad()
    l = crit(model(images), labels.long())
    losses.append(l.item())
    l.backward()
    opt.step()
losses.append(crit(model(images), labels.long()).item())
out["train.adamw_losses"] = np.array(losses, dtype=np.float32)
goldenio.write(sys.argv[1] if len(sys.argv) > 1 else "tests/data/vit_golden.bin", out)
print("timm", timm.__version__, "torch", torch.__version__, "loss", loss.item(),
      "adamw losses", losses)
