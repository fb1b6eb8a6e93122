#!/usr/bin/env python3
"""The table of scripts/gpu-zero-bubble: per pipeline size and schedule, ms/step and img/s (steps
6..last of the metrics file), the schedule's ideal bubble and the measured one per stage
(vit_train --trace), and each stage's peak memory (bytes of live tensors) against the plan's
(vit_train --dry-run).
  zero_bubble_summary.py OUTDIR PP... -- STYLE...
reads OUTDIR/pp<P>_<style>.{toml,jsonl,log,plan.txt}."""
import json
import re
import sys


def parse(out, pp, style):
    tag = f"{out}/pp{pp}_{style}"
    row = {"pp": pp, "style": style}
    try:
        batch = int(re.search(r"^batch_size = (\d+)", open(f"{tag}.toml").read(), re.M).group(1))
        steps = [r for r in map(json.loads, open(f"{tag}.jsonl")) if r.get("type") == "step"]
        a = next(r for r in steps if r["step"] >= 6)
        b = steps[-1]
        if b["step"] > a["step"]:
            ms = 1000 * (b["seconds"] - a["seconds"]) / (b["step"] - a["step"])
            row["ms"], row["ips"] = ms, batch * 1000 / ms
    except (OSError, StopIteration, AttributeError, ValueError, KeyError):
        pass
    try:
        log = open(f"{tag}.log").read()
        m = re.search(r"ideal bubble ([0-9.]+)", log)
        row["ideal"] = float(m.group(1)) if m else None
        row["bubble"], row["peak"] = {}, {}
        for r, st, bub, peak in re.findall(
                r"rank (\d+) \(stage (\d+)\): measured bubble ([0-9.]+), peak memory (\d+) bytes", log):
            row["bubble"][int(st)] = float(bub)
            row["peak"][int(st)] = max(row["peak"].get(int(st), 0), int(peak))
        row["error"] = "rror" in log and not row["bubble"]
    except OSError:
        row["error"] = True
    try:
        plan = {}
        for st, mib in re.findall(r"# memory per process, stage (\d+) \(layers [^)]*\):.*? peak ([0-9.]+) MiB",
                                  open(f"{tag}.plan.txt").read()):
            plan[int(st)] = float(mib)
        row["plan"] = plan
    except OSError:
        row["plan"] = {}
    return row


def fmt(v, f="{:.1f}"):
    return "-" if v is None else f.format(v)


def main():
    args = sys.argv[1:]
    cut = args.index("--")
    out, pps, styles = args[0], [int(p) for p in args[1:cut]], args[cut + 1:]
    print(f"{'layout':<16} {'ms/step':>8} {'img/s':>8} {'ideal':>6} {'measured bubble per stage':<28} "
          f"peak MiB per stage, measured/plan")
    for pp in pps:
        for style in styles:
            r = parse(out, pp, style)
            bub = " ".join(f"{r.get('bubble', {}).get(s, float('nan')):.3f}" for s in range(pp))
            mem = " ".join(
                f"{fmt(r.get('peak', {}).get(s, 0) / 2**20 if r.get('peak', {}).get(s) else None)}/"
                f"{fmt(r['plan'].get(s))}" for s in range(pp))
            print(f"pp{pp} {style:<12} {fmt(r.get('ms')):>8} {fmt(r.get('ips'), '{:.0f}'):>8} "
                  f"{fmt(r.get('ideal'), '{:.3f}'):>6} {bub:<28} {mem}"
                  f"{'  (failed: see the log)' if r.get('error') else ''}")


if __name__ == "__main__":
    main()
