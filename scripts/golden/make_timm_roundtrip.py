#!/usr/bin/env python3
"""Golden files for the checkpoint round trip with timm (tests/checkpoint/test_timm_roundtrip.cpp).

Where torch and timm exist (the GPU hosts):

    python3 scripts/golden/make_timm_roundtrip.py OUTDIR tests/data/ours_vit_small.safetensors

1. timm -> ours: a timm VisionTransformer (img 32, patch 8, dim 64, depth 2, heads 4, 10 classes;
   norms and biases perturbed), saved with its state_dict names as OUTDIR/timm_vit_small.safetensors
   (written here byte by byte: the safetensors format, no dependency on the safetensors package).
2. ours -> timm: our checkpoint (written by libcai's save_safetensors from ViT::init(123)) loaded
   into the same architecture with load_state_dict(strict=True).
Both models' eval-mode logits on a fixed batch go to OUTDIR/timm_roundtrip.bin (goldenio format);
the C++ test loads the timm file with the --init-from path and checks both sets of logits.
"""
import json
import struct
import sys

import numpy as np
import timm
import torch

import goldenio


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4"))
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    header["__metadata__"] = {"format": "pt", "writer": "make_timm_roundtrip.py"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, t = e["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + t], dtype="<f4").reshape(e["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out


out_dir, ours_path = sys.argv[1], sys.argv[2]
cfg = dict(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=64, depth=2,
           num_heads=4, mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0, drop_path_rate=0.0)
torch.manual_seed(1)
model = timm.models.vision_transformer.VisionTransformer(**cfg).float().eval()
with torch.no_grad():
    for n, p in model.named_parameters():
        if "norm" in n or n.endswith(".bias"):
            p.add_(0.1 * torch.randn_like(p))
    model.cls_token.normal_(std=0.02)
write_safetensors(f"{out_dir}/timm_vit_small.safetensors", model.state_dict())
torch.manual_seed(2)
images = torch.randn(4, 3, 32, 32)
with torch.no_grad():
    timm_logits = model(images)
    ours = timm.models.vision_transformer.VisionTransformer(**cfg).float().eval()
    ours.load_state_dict(read_safetensors(ours_path), strict=True)  # every name, every shape
    ours_logits = ours(images)
goldenio.write(f"{out_dir}/timm_roundtrip.bin", {"input.images": images,
                                                 "timm.logits": timm_logits,
                                                 "ours_in_timm.logits": ours_logits})
print("torch", torch.__version__, "timm", timm.__version__, "strict load of", ours_path, "ok;",
      "logits", tuple(timm_logits.shape), tuple(ours_logits.shape))
