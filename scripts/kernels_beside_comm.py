#!/usr/bin/env python3
"""Each GEMM and attention kernel of a profiled timeline split by whether an NCCL kernel ran beside
it (train.kernel_profile = X.md writes X.md.csv: index,start_us,duration_us,stream,grid,block,name).

  python3 scripts/kernels_beside_comm.py X.md.csv [X2.md.csv ...]

Per timeline: the summed µs of those kernels with an NCCL kernel beside them for at least 90% of
their time ('beside'), for at most 10% ('alone') and in between ('mixed'); then the 8 kernels (name,
grid) with the most time, each with its calls and median µs beside and alone and their ratio. One
name can serve GEMMs of several shapes: the medians compare the calls of one name and grid."""
import collections
import csv
import statistics
import sys


def main(paths):
    for path in paths:
        rows = list(csv.DictReader(open(path)))
        for r in rows:
            r["s"] = float(r["start_us"])
            r["e"] = r["s"] + float(r["duration_us"])
        comm = sorted((r["s"], r["e"]) for r in rows if "nccl" in r["name"].lower())

        def covered(r):
            c = sum(max(0.0, min(e, r["e"]) - max(s, r["s"])) for s, e in comm)
            return c / max(1e-9, r["e"] - r["s"])

        by = collections.defaultdict(lambda: {"beside": [], "alone": []})
        total = collections.Counter()
        for r in rows:
            if not any(k in r["name"] for k in ("nvjet", "gemm", "flash")):
                continue
            c = covered(r)
            kind = "beside" if c >= 0.9 else "alone" if c <= 0.1 else "mixed"
            total[kind] += r["e"] - r["s"]
            if kind != "mixed":
                by[(r["name"][:64], r["grid"])][kind].append(r["e"] - r["s"])
        print(f"{path}: GEMM + attention µs beside NCCL {total['beside']:.0f}, alone "
              f"{total['alone']:.0f}, mixed {total['mixed']:.0f}")
        print(f"  {'kernel':64} {'grid':>5} {'beside':>13} {'alone':>13} ratio")
        top = sorted(by.items(), key=lambda kv: -sum(kv[1]["beside"]) - sum(kv[1]["alone"]))[:8]
        for (name, grid), v in top:
            b = statistics.median(v["beside"]) if v["beside"] else 0.0
            a = statistics.median(v["alone"]) if v["alone"] else 0.0
            ratio = f"{b / a:.2f}" if a and b else ""
            print(f"  {name:64} {grid:>5} {len(v['beside']):4d} {b:8.1f} {len(v['alone']):4d} "
                  f"{a:8.1f} {ratio}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
