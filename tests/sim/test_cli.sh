#!/usr/bin/env bash
# colossalai-sim end to end: a 1F1B replay writes its JSON and trace; --config replays a vit_train
# config through the plan (data, pipeline and tensor parallel layouts, and its errors); the
# layout search; folded replicas against every rank; --benchmark-layouts' rows; a bad cluster
# file fails naming the key. Usage: test_cli.sh COLOSSALAI_SIM CLUSTER_DIR
set -euo pipefail
sim=$1
clusters=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$sim" --cluster "$clusters/h200-4.toml" --nproc 4 --schedule 1f1b --stages 4 --microbatches 8 \
  --fwd-ms 10 --bwd-ms 20 --act-bytes 1e6 --json "$out/r.json" --trace "$out/r.trace" | tee "$out/log"
grep -q "bubble per stage" "$out/log"
python3 - "$out/r.json" "$out/r.trace" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert abs(r["step_ms"] - 330.0) < 0.5, r["step_ms"]
assert len(r["bubble"]) == 4 and abs(r["bubble_mean"] - 3 / 11) < 1e-3, r["bubble"]
for k in ["img_per_s", "peak_mem_bytes", "compute_ms", "comm_ms", "idle_ms", "wall_s"]:
    assert k in r, k
t = json.load(open(sys.argv[2]))
names = {e["name"] for e in t["traceEvents"] if e["ph"] == "X"}
assert "F(mb=0,c=0)" in names and "SendAct(mb=0,c=0,->1)" in names, sorted(names)[:10]
PY
# Zero-bubble schedules: ZB-H1 at the paper's 3m + p - 1 units (10 ms each), ZB-V (2 chunks by
# default) lower still, B and W as separate spans.
for s in zbh1 zbv; do
  "$sim" --cluster "$clusters/h200-4.toml" --nproc 4 --schedule $s --stages 4 --microbatches 8 \
    --fwd-ms 10 --bwd-ms 20 --act-bytes 1e6 --json "$out/$s.json" --trace "$out/$s.trace" >/dev/null
done
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
h1, zv = (json.load(open(f"{d}/{n}.json")) for n in ("zbh1", "zbv"))
assert abs(h1["step_ms"] - 270.0) < 0.5, h1["step_ms"]
assert abs(h1["bubble_mean"] - 3 / 27) < 1e-3, h1["bubble_mean"]
assert zv["step_ms"] < h1["step_ms"] and zv["bubble_mean"] < h1["bubble_mean"], (zv, h1)
for n, c in (("zbh1", 0), ("zbv", 1)):
    names = {e["name"] for e in json.load(open(f"{d}/{n}.trace"))["traceEvents"] if e["ph"] == "X"}
    assert f"BI(mb=0,c={c})" in names and f"BW(mb=0,c={c})" in names, sorted(names)[:20]
PY
configs=$(cd "$(dirname "$0")/../../apps/vit_train/configs" && pwd)
cfg=(--config "$configs/fmnist_tiny.toml" --cluster "$clusters/cpu-2.toml")
"$sim" "${cfg[@]}" --nproc 1 --json "$out/one.json" >/dev/null
"$sim" "${cfg[@]}" --nproc 2 --json "$out/dp2.json" >/dev/null
"$sim" "${cfg[@]}" --nproc 2 --set parallel.tensor.mode=1d --set parallel.tensor.size=2 \
  --json "$out/tp2.json" >/dev/null
"$sim" "${cfg[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.num_microbatches=4 \
  --json "$out/pp2.json" --trace "$out/pp2.trace" >/dev/null
for s in zbh1 zbv; do
  "$sim" "${cfg[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.num_microbatches=4 \
    --set parallel.pp_style=$s --set parallel.num_model_chunks=$([ $s = zbv ] && echo 2 || echo 1) \
    --json "$out/pp2$s.json" --trace "$out/pp2$s.trace" >/dev/null
done
# 2d and 3d: the plan's sub-group collectives (row/col, input/weight/output) on their ranks.
"$sim" "${cfg[@]}" --nproc 4 --set parallel.tensor.mode=2d --set parallel.tensor.size=4 \
  --json "$out/tp2d.json" --trace "$out/tp2d.trace" >/dev/null
"$sim" --config "$configs/fmnist_tiny.toml" --cluster "$clusters/dgx-h100-64.toml" --nproc 8 \
  --set parallel.tensor.mode=3d --set parallel.tensor.size=8 --json "$out/tp3d.json" >/dev/null
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
one, dp2, tp2, pp2 = (json.load(open(f"{d}/{n}.json")) for n in ("one", "dp2", "tp2", "pp2"))
for n in ("tp2d", "tp3d"):
    r = json.load(open(f"{d}/{n}.json"))
    assert len(r["comm_ms"]) == (4 if n == "tp2d" else 8) and all(c > 0 for c in r["comm_ms"]), r
tp2d = json.load(open(f"{d}/tp2d.json"))
assert all(c < one["compute_ms"][0] for c in tp2d["compute_ms"]), tp2d["compute_ms"]
t = json.load(open(f"{d}/tp2d.trace"))
names = {e["name"] for e in t["traceEvents"] if e["ph"] == "X"}
assert any("input blocks broadcast" in n for n in names), sorted(names)[:20]
# Data parallel: the same compute per rank, a gradient all-reduce, twice the global batch.
assert abs(dp2["compute_ms"][0] - one["compute_ms"][0]) < 1e-6 * one["compute_ms"][0], (dp2, one)
assert dp2["step_ms"] > one["step_ms"] and dp2["img_per_s"] > 1.5 * one["img_per_s"]
# Tensor parallel: half the layers' work per rank plus its collectives.
assert tp2["compute_ms"][0] < 0.8 * one["compute_ms"][0], (tp2["compute_ms"], one["compute_ms"])
assert tp2["comm_ms"][0] > 0
# Pipeline: two stages with bubbles, half the parameters each.
assert len(pp2["bubble"]) == 2 and all(b > 0 for b in pp2["bubble"]), pp2["bubble"]
assert max(pp2["peak_mem_bytes"]) < one["peak_mem_bytes"][0]
t = json.load(open(f"{d}/pp2.trace"))
names = {e["name"] for e in t["traceEvents"] if e["ph"] == "X"}
assert any(n.startswith("blocks.0 attn.qkv") for n in names), sorted(names)[:20]
# Zero-bubble pipelines from the config: the linears' GEMMs split, dx in B and dw in W; the
# same work as 1F1B per stage, in a shorter or equal step.
for s in ("zbh1", "zbv"):
    r = json.load(open(f"{d}/pp2{s}.json"))
    assert len(r["bubble"]) == 2, r["bubble"]
    assert r["step_ms"] <= pp2["step_ms"] * 1.001, (s, r["step_ms"], pp2["step_ms"])
    t = json.load(open(f"{d}/pp2{s}.trace"))
    names = {e["name"] for e in t["traceEvents"] if e["ph"] == "X"}
    assert any(n.endswith("attn.qkv bwd dx") for n in names), (s, sorted(names)[:30])
    assert any(n.endswith("attn.qkv bwd dw") for n in names), (s, sorted(names)[:30])
print("--config layouts: ok")
PY
# Calibration: colossalai benchmark --calibrate times the model's kernels (per op, no step
# figure); the simulator times the ops from it and says so.
"$(dirname "$sim")/colossalai" benchmark -g 1 --device cpu --calibrate "$out/cal.json" \
  --config "$configs/fmnist_tiny.toml" --set train.batch_size=8 >"$out/cal.log" 2>&1 ||
  { cat "$out/cal.log"; exit 1; }
"$sim" "${cfg[@]}" --nproc 2 --set train.batch_size=8 --calibration "$out/cal.json" \
  --json "$out/cal_dp2.json" | tee "$out/cal_dp2.txt" | grep -q "measured by the calibration"
python3 - "$out/cal.json" "$out/cal_dp2.json" <<'PY'
import json, sys
cal, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for k in ("attn.qkv|fwd", "attn|bwd", "mlp.fc2|bwd", "norm1|fwd", "optimizer|step"):
    assert cal["samples"].get(k), k
t = r["compute_ops_timed"]
assert t["measured"] > 0 and t["roofline"] == 0, t
print("calibration: ok")
PY
if "$sim" "${cfg[@]}" --nproc 8 --set parallel.tensor.mode=1d --set parallel.tensor.size=8 \
  2>"$out/err"; then exit 1; fi
grep -q "num_heads 4 is not divisible by the tensor-parallel size 8" "$out/err" || { cat "$out/err"; exit 1; }
# Layout search: every layout of 4 processes, ranked; the best written as a config vit_train takes.
"$sim" --search "${cfg[@]}" --nproc 4 --out "$out/best.toml" | tee "$out/search.log"
grep -q "layouts considered" "$out/search.log"
[ "$(grep -cE '^ +[0-9]+  dp ' "$out/search.log")" -eq 10 ] || { echo "top 10"; exit 1; }
# vit_train is built beside colossalai-sim (build/apps).
dry=$("$(dirname "$sim")/vit_train" --config "$out/best.toml" --dry-run --nproc 4)
grep -q "plan: 4 processes" <<<"$dry"
# Identical data-parallel replicas are simulated once (a node's worth here): same step as every
# rank, the JSON still per job rank.
dgx=(--config "$configs/fmnist_tiny.toml" --cluster "$clusters/dgx-h100-64.toml" --nproc 32)
"$sim" "${dgx[@]}" --json "$out/fold.json" | grep -q "32 ranks as 4 identical copies of 8"
"$sim" "${dgx[@]}" --no-fold --json "$out/all.json" >/dev/null
python3 - "$out/fold.json" "$out/all.json" <<'PY'
import json, sys
f, a = (json.load(open(p)) for p in sys.argv[1:])
assert (f["copies"], f["simulated_ranks"], a["copies"]) == (4, 8, 1), (f["copies"], a["copies"])
assert abs(f["step_ms"] / a["step_ms"] - 1) < 1e-9 and len(f["compute_ms"]) == 32, (f, a)
PY
# colossalai benchmark --simulate's rows: every layout of 4 GPUs (dp = 4 / tensor size).
"$sim" --benchmark-layouts "${cfg[@]}" --nproc 4 --batch 8 >"$out/bench.json"
"$sim" --benchmark-layouts "${cfg[@]}" --nproc 4 --model block >"$out/block.json"
python3 - "$out/bench.json" "$out/block.json" <<'PY'
import json, sys
b, k = (json.load(open(p)) for p in sys.argv[1:])
assert [(r["mode"], r["depth"], r["status"]) for r in b["layouts"]] == [
    (None, 1, "ok"), ("1d", 1, "ok"), ("2d", 1, "ok"), ("2.5d", 1, "ok")], b["layouts"]
assert all(r["simulated"] and r["step_ms"] > 0 for r in b["layouts"]), b
# -m block: the blocks alone through the plan, every layout (the default -d 1024 -s 512 -l 2).
assert [(r["mode"], r["status"]) for r in k["layouts"]] == [
    (None, "ok"), ("1d", "ok"), ("2d", "ok"), ("2.5d", "ok")], k["layouts"]
assert all(r["step_ms"] > 0 and r["optimizer_ms"] == 0 and (r["comm_bytes"] > 0) ==
           (r["mode"] is not None) for r in k["layouts"]), k
PY
if "$sim" --cluster "$clusters/h200-4.toml" --config "$out/missing.toml" 2>"$out/err"; then exit 1; fi
grep -q "missing.toml" "$out/err"
sed 's/memory_gib = .*/memory_gib = "big"/' "$clusters/h200-2.toml" >"$out/bad.toml"
if "$sim" --cluster "$out/bad.toml" --schedule 1f1b --stages 2 2>"$out/err"; then exit 1; fi
grep -q "bad.toml: gpu.memory_gib = \"big\" is not a finite number" "$out/err"
# Without a profile every op time is a placeholder: the summary and the JSON say so.
"$sim" "${cfg[@]}" --nproc 2 --json "$out/guess.json" >"$out/guess.txt"
grep -q "warning: 83 of 83 compute ops of rank 0 timed by the roofline's placeholder" \
  "$out/guess.txt" || { cat "$out/guess.txt"; exit 1; }
python3 -c 'import json, sys; w = json.load(open(sys.argv[1]))["warnings"]; assert any(
    "placeholder" in x for x in w), w' "$out/guess.json"
# A profile of another GPU family than the cluster's is named.
cat >"$out/h200.json" <<'JSON'
{"device": "NVIDIA H200 (cuda, bf16), measured by colossalai benchmark --calibrate",
 "samples": {"elementwise": [[1e6, 4e6, 1e-5]]}}
JSON
"$sim" --config "$configs/fmnist_tiny.toml" --cluster "$clusters/h100-1.toml" --nproc 1 \
  --set precision.mode=bf16 --set train.device=cuda --calibration "$out/h200.json" >"$out/fam.txt"
grep -q "the profile was measured on H200 .*, the cluster h100-1 has H100" "$out/fam.txt" ||
  { cat "$out/fam.txt"; exit 1; }
# Flags of another mode are errors, not ignored.
for bad in "--fwd-ms 3" "--stages 2" "--top 3" "--batch 4" "--schedule 1f1b"; do
  # shellcheck disable=SC2086
  if "$sim" "${cfg[@]}" --nproc 2 $bad 2>"$out/err" >/dev/null; then
    echo "accepted $bad with --config"; exit 1
  fi
  grep -Eq "applies to|choose one of" "$out/err" || { cat "$out/err"; exit 1; }
done
# --collectives flows: the data-parallel all-reduce of a shipped 2-GPU profile runs as flows over
# the fitted links (the summary and the JSON say so), and an unknown model is refused.
cal2="$(dirname "$0")/../../sim/calibrations/h200x2-vit_base_patch16_224-bf16-nccl.json"
"$sim" --cluster "$clusters/h200-2.toml" --data-parallel --nproc 2 --fwd-ms 10 --bwd-ms 20 \
  --grad-bytes 3.4e8 --calibration "$cal2" --collectives flows --json "$out/flows.json" |
  tee "$out/flows.txt" | grep -q "1 as flows over links fitted to the calibration"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
assert r["collectives"] == "flows" and r["comm_ops_timed"]["flows"] == 1, r["comm_ops_timed"]' \
  "$out/flows.json"
if "$sim" --cluster "$clusters/h200-2.toml" --data-parallel --collectives slept >/dev/null 2>&1; then
  echo "accepted --collectives slept"; exit 1
fi
echo "colossalai-sim CLI: ok"
