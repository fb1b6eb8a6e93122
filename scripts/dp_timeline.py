#!/usr/bin/env python3
"""Where a profiled step's time goes, from the timeline a kernel profile writes beside its table
(train.kernel_profile = X.md writes X.md.csv: index,start_us,duration_us,stream,grid,block,name).

  python3 scripts/dp_timeline.py X.md.csv [STEPS]

Prints per step (the records' span divided by STEPS; by default the "N profiled steps" of the
table beside it, X.md, else 5, the profile's default): the span,
the time some work runs (union of all records), idle time, the summed time of compute kernels and
of communication kernels (NCCL), the communication no compute hides (exposed), the compute that
runs beside communication, and the largest idle gaps and exposed communication intervals with the
records around them: what a data-parallel step spends beyond the one-GPU step."""
import csv
import os
import re
import sys


def union(iv):
    iv = sorted(iv)
    out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(iv):
    return sum(e - s for s, e in iv)


def intersect(a, b):
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def main():
    path = sys.argv[1]
    steps = 5
    table = path[: -len(".csv")] if path.endswith(".csv") else ""
    if table and os.path.exists(table):
        m = re.search(r"(\d+) profiled steps", open(table).read())
        if m:
            steps = int(m.group(1))
    if len(sys.argv) > 2:
        steps = int(sys.argv[2])
    recs = []
    with open(path) as f:
        for r in csv.DictReader(f):
            s, d = float(r["start_us"]), float(r["duration_us"])
            recs.append((s, s + d, r["stream"], r["name"]))
    if not recs:
        print(f"{path}: no records")
        return
    recs.sort()
    comm = [r for r in recs if "nccl" in r[3].lower()]
    work = [r for r in recs if "nccl" not in r[3].lower()]
    span = max(r[1] for r in recs) - recs[0][0]
    all_u = union([[r[0], r[1]] for r in recs])
    work_u = union([[r[0], r[1]] for r in work])
    comm_u = union([[r[0], r[1]] for r in comm])
    both = intersect(work_u, comm_u)
    per = lambda us: us / steps / 1e3  # noqa: E731 (ms per step)
    print(f"{path}: {len(recs)} records, {steps} steps, streams "
          + ", ".join(sorted({r[2] for r in recs})))
    print(f"  span {per(span):.2f} ms a step; busy {per(length(all_u)):.2f}; idle {per(span - length(all_u)):.2f}")
    print(f"  compute kernels: sum {per(sum(r[1] - r[0] for r in work)):.2f} ms, union {per(length(work_u)):.2f}")
    print(f"  communication kernels: sum {per(sum(r[1] - r[0] for r in comm)):.2f} ms, union {per(length(comm_u)):.2f}, "
          f"beside compute {per(length(both)):.2f}, exposed {per(length(comm_u) - length(both)):.2f}")
    # Idle gaps: between consecutive union intervals.
    gaps = []
    for a, b in zip(all_u, all_u[1:]):
        gaps.append((b[0] - a[1], a[1], b[0]))
    gaps.sort(reverse=True)

    def around(t):
        before = max((r for r in recs if r[1] <= t + 0.05), key=lambda r: r[1], default=None)
        after = min((r for r in recs if r[0] >= t - 0.05), key=lambda r: r[0], default=None)
        return (before[3][:60] if before else "-", after[3][:60] if after else "-")

    print(f"  idle gaps over 20 us: {sum(1 for g in gaps if g[0] > 20)} ({per(sum(g[0] for g in gaps if g[0] > 20)):.2f} ms a step); largest:")
    for g, s, e in gaps[:12]:
        b, a = around(s)
        print(f"    {g:8.1f} us at {s - recs[0][0]:10.1f}: after {b} | before {a}")
    exposed = []
    for s, e in comm_u:
        hid = length(intersect([[s, e]], work_u))
        if e - s - hid > 5:
            exposed.append((e - s - hid, s, e))
    exposed.sort(reverse=True)
    print("  largest exposed communication:")
    for x, s, e in exposed[:8]:
        b, a = around(s)
        print(f"    {x:8.1f} us of {e - s:8.1f} at {s - recs[0][0]:10.1f}: after {b}")
    # The per-kernel comparison is in the table; here the step's tail: from the last
    # communication kernel's end to the end of the span.
    by = {}
    for r in comm:
        by.setdefault(r[3][:70], []).append(r[1] - r[0])
    for name, ds in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {name}: {len(ds) / steps:g} a step, mean {sum(ds) / len(ds):.1f} us")


if __name__ == "__main__":
    main()
