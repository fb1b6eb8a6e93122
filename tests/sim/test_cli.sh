#!/usr/bin/env bash
# colossalai-sim end to end: a 1F1B replay writes its JSON and trace; --config says it is not wired;
# a bad cluster file fails naming the key. Usage: test_cli.sh COLOSSALAI_SIM CLUSTER_DIR
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
if "$sim" --cluster "$clusters/h200-4.toml" --config x.toml 2>"$out/err"; then exit 1; fi
grep -q "not wired yet" "$out/err"
sed 's/memory_gib = .*/memory_gib = "big"/' "$clusters/h200-2.toml" >"$out/bad.toml"
if "$sim" --cluster "$out/bad.toml" --schedule 1f1b --stages 2 2>"$out/err"; then exit 1; fi
grep -q "bad.toml: gpu.memory_gib = \"big\" is not a number" "$out/err"
echo "colossalai-sim CLI: ok"
