#!/usr/bin/env python3
"""How long NVML's reads take on this host (the trainer reads energy, SM clock and power at every
values step): python3 scripts/nvml_timing.py [SECONDS]  (prints the median and max per call)."""
import ctypes, statistics, sys, time
n = ctypes.CDLL("libnvidia-ml.so.1")
assert n.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert n.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
e, c, p = ctypes.c_ulonglong(), ctypes.c_uint(), ctypes.c_uint()
calls = {
    "energy": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(e)),
    "sm clock": lambda: n.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(c)),
    "power": lambda: n.nvmlDeviceGetPowerUsage(h, ctypes.byref(p)),
}
end = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 3)
ts = {k: [] for k in calls}
while time.time() < end:
    for k, f in calls.items():
        t = time.perf_counter(); f(); ts[k].append(1e3 * (time.perf_counter() - t))
    time.sleep(0.01)
for k, v in ts.items():
    print(f"nvml {k}: median {statistics.median(v):.3f} ms, max {max(v):.3f} ms over {len(v)} calls")
