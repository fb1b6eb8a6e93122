"""Writer for the golden-data format read by tests (tests/common/golden.h).

File layout (little-endian):
  8 bytes  magic "CAIGOLD1"
  uint32   number of tensors
  per tensor:
    uint32 name length, name (UTF-8)
    uint32 dtype (0 = float32, 1 = int32)
    uint32 ndim, int64 dims[ndim]
    data, row-major
"""
import struct

import numpy as np


def write(path, tensors):
    """tensors: dict name -> numpy array (float32 or int32) or torch tensor."""
    with open(path, "wb") as f:
        f.write(b"CAIGOLD1")
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors.items():
            a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
            if a.dtype.kind == "f":
                a, code = a.astype("<f4"), 0
            elif a.dtype.kind in "iu":
                a, code = a.astype("<i4"), 1
            else:
                raise ValueError(f"{name}: unsupported dtype {a.dtype}")
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<II", code, a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(np.ascontiguousarray(a).tobytes())
