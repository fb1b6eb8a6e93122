#!/usr/bin/env python3
"""The layout search against measured runs: scripts/search_validation.py DIR STEPS

DIR holds `benchmark --search --json` output (search.json) and, per measured layout of rank R,
rRRR.toml, rRRR.metrics.jsonl (vit_train's, STEPS steps) and rRRR.log (scripts/gpu-layouts
search writes them). Writes DIR/measured.jsonl and prints the Spearman rank correlation of
simulated and measured throughput, the search's pick against the measured best, and one row per
layout. A layout whose run failed or hung is listed apart and left out of the correlation; the
pick is the search's first place whether it ran or not (one that does not run scores 0%)."""
import json, os, re, sys
s, steps = sys.argv[1], int(sys.argv[2])
ranked = json.load(open(f"{s}/search.json"))["ranked"]
rows = []
for i, r in enumerate(ranked):
    m = f"{s}/r{i + 1:03d}.metrics.jsonl"
    if not os.path.exists(f"{s}/r{i + 1:03d}.toml"):
        continue
    ms = None
    if os.path.exists(m):
        st = [json.loads(l) for l in open(m) if '"step"' in l]
        st = [x for x in st if x["step"] <= steps]
        if len(st) > 3:
            warm = max(2, st[-1]["step"] // 5)
            a = next(x for x in st if x["step"] >= warm)
            b = st[-1]
            ms = 1000 * (b["seconds"] - a["seconds"]) / (b["step"] - a["step"])
    log = open(f"{s}/r{i + 1:03d}.log", errors="replace").read()
    peak = re.search(r"peak memory of this process: (\d+) bytes", log)
    glob = r["img_per_s"] * r["step_ms"] / 1000
    rows.append({"rank": i + 1, "layout": r["layout"], "sim_step_ms": r["step_ms"],
                 "sim_img_per_s": r["img_per_s"], "sim_peak_mem_bytes": r["peak_mem_bytes"],
                 "step_ms": ms, "img_per_s": glob * 1000 / ms if ms else None,
                 "peak_mem_bytes": int(peak.group(1)) if peak else None})
with open(f"{s}/measured.jsonl", "w") as f:
    for x in rows:
        f.write(json.dumps(x) + "\n")
ok = [x for x in rows if x["img_per_s"]]
def ranks(v):
    o = sorted(range(len(v)), key=lambda k: v[k])
    r = [0.0] * len(v)
    i = 0
    while i < len(o):  # ties share their mean rank
        j = i
        while j + 1 < len(o) and v[o[j + 1]] == v[o[i]]:
            j += 1
        for k in range(i, j + 1):
            r[o[k]] = (i + j) / 2
        i = j + 1
    return r
if len(ok) > 2:
    a, b = ranks([x["sim_img_per_s"] for x in ok]), ranks([x["img_per_s"] for x in ok])
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((p - ma) * (q - mb) for p, q in zip(a, b))
    rho = cov / (sum((p - ma) ** 2 for p in a) * sum((q - mb) ** 2 for q in b)) ** 0.5
    best = max(ok, key=lambda x: x["img_per_s"])
    pick = rows[0]  # the search's first place, whether it ran or not
    got = pick["img_per_s"] or 0.0
    print(f"measured {len(ok)} of {len(rows)} picked layouts (Spearman over those that ran); "
          f"Spearman {rho:.3f}; the pick (rank {pick['rank']}) {got:.1f} img/s, the measured best "
          f"(rank {best['rank']}) {best['img_per_s']:.1f}: {100 * got / best['img_per_s']:.1f}%")
    failed = [x for x in rows if not x["img_per_s"]]
    if failed:
        print("did not finish (failed or hung; see their logs): " +
              ", ".join(f"rank {x['rank']} {x['layout']}" for x in failed))
for x in rows:
    err = 100 * (x["sim_step_ms"] / x["step_ms"] - 1) if x["step_ms"] else float("nan")
    print(f"{x['rank']:4} {x['layout']:66} sim {x['sim_step_ms']:8.2f} ms  measured "
          f"{x['step_ms'] or float('nan'):8.2f} ms  {err:+6.1f}%  img/s {x['sim_img_per_s']:7.1f} / "
          f"{x['img_per_s'] or float('nan'):7.1f}")
