#!/usr/bin/env bash
# colossalai benchmark end to end on CPU processes: the layouts of 4 and 8 ranks, every one
# measured (none, 1d, 2d, 2.5d, 3d), the bytes each mode's collectives carried, the JSON, errors.
#   test_benchmark.sh COLOSSALAI
# With --simulate (builds with SimGrid): the simulated table (every layout, "simulated": true),
# --compare against a simulated JSON and simulated on the spot, and the error when
# colossalai-sim is missing (--search: test_benchmark_search.sh); -m block and -m mlp
# simulated for every layout with exactly the measured tensor-parallel bytes, and a measured
# block run compared with its simulation per layout.
#   test_benchmark.sh COLOSSALAI --simulate COLOSSALAI_SIM CONFIG_DIR CLUSTER_DIR
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "${2:-}" = --simulate ]; then
  sim=$3 configs=$4 clusters=$5
  [ "$(dirname "$(realpath "$sim")")" = "$(dirname "$(realpath "$bin")")" ] ||
    { echo "colossalai-sim is not beside colossalai"; exit 1; }
  fm=(-m vit --config "$configs/fmnist_tiny.toml")
  # The simulated table: every layout of 4 GPUs of cpu-2, marked simulated.
  "$bin" benchmark --gpus 4 --simulate --cluster "$clusters/cpu-2.toml" "${fm[@]}" -b 8 \
    --json "$tmp/sim.json" | tee "$tmp/sim.txt"
  grep -q "(simulated" "$tmp/sim.txt" || { echo "table not marked simulated"; exit 1; }
  small=(--gpus 4 -d 256 -s 64 -b 4)
  for m in mlp block; do
    "$bin" benchmark "${small[@]}" --simulate --cluster "$clusters/cpu-2.toml" -m $m \
      --json "$tmp/$m.json" >/dev/null
  done
  # Measured -m mlp, and -m block beside its simulation made on the spot (cpu-2).
  "$bin" benchmark "${small[@]}" --device cpu -w 1 -p 2 -m mlp --json "$tmp/mlp_meas.json" \
    >/dev/null 2>&1
  "$bin" benchmark "${small[@]}" --device cpu -w 1 -p 2 -m block --compare \
    --cluster "$clusters/cpu-2.toml" --json "$tmp/block_meas.json" >"$tmp/cmp_block.txt" \
    2>/dev/null
  cat "$tmp/cmp_block.txt"
  grep -q "measured against .* (simulated)" "$tmp/cmp_block.txt" ||
    { echo "no block comparison"; exit 1; }
  for l in "none " "1d (size 4)" "2d (size 4)" "2.5d (size 4, depth 1)"; do
    grep -E "^$(sed 's/[().]/\\&/g' <<<"$l") +[0-9.]+ +[0-9.]+ +[-+][0-9.]+%" \
      "$tmp/cmp_block.txt" >/dev/null || { echo "no compared block row for '$l'"; exit 1; }
  done
  # Simulated block and mlp rows: every measured layout, the tensor-parallel bytes exactly the
  # measured ones (both count what the layers hand to their collectives).
  python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
key = lambda r: (r["mode"], r["size"], r["depth"])
for m in ("mlp", "block"):
    sim = {key(r): r for r in json.load(open(f"{tmp}/{m}.json"))["layouts"]}
    meas = json.load(open(f"{tmp}/{m}_meas.json"))["layouts"]
    assert len(meas) == 4 and len(sim) == 4, (meas, sim)
    for r in meas:
        s = sim[key(r)]
        assert r["status"] == "ok" and s["status"] == "ok" and s["simulated"] is True, (r, s)
        assert s["comm_bytes"] == r["comm_bytes"], (m, key(r), s["comm_bytes"], r["comm_bytes"])
        assert s["forward_ms"] > 0 and s["backward_ms"] > 0 and s["optimizer_ms"] == 0, s
        assert abs(s["forward_ms"] + s["backward_ms"] - s["step_ms"]) < 1e-6, s
        assert s["peak_mem_bytes"] > 0 and s["dp"] == 4 // r["size"], s
        # `none` is 4-way data parallel with its gradients all-reduced, as measured.
        assert (s["dp_comm_bytes"] > 0) == (r["mode"] is None), s
print("benchmark --simulate -m mlp|block: every layout, bytes = measured: ok")
PY
  # --calibration reaches the simulator: the shipped CPU profile times the ops (slower than the
  # placeholder efficiencies on cpu-2's nominal peak).
  "$bin" benchmark --gpus 4 --simulate --cluster "$clusters/cpu-2.toml" "${fm[@]}" -b 8 \
    --calibration "$configs/../../../sim/calibrations/cpu-xeon-1thread-fmnist_tiny-fp32.json" \
    --json "$tmp/cal.json" >/dev/null
  python3 - "$tmp/sim.json" "$tmp/cal.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["layouts"] for p in sys.argv[1:3])
for x, y in zip(a, b):
    assert x["mode"] == y["mode"] and y["step_ms"] != x["step_ms"], (x, y)
print("benchmark --simulate --calibration: ok")
PY
  python3 - "$tmp/sim.json" "$tmp/mlp.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["simulated"] is True and j["gpus"] == 4, j
got = sorted((r["mode"] or "none", r["size"], r["depth"]) for r in j["layouts"])
assert got == sorted([("none", 1, 1), ("1d", 4, 1), ("2d", 4, 1), ("2.5d", 4, 1)]), got
for r in j["layouts"]:
    assert r["simulated"] is True and r["status"] == "ok", r
    assert r["step_ms"] > 0 and abs(r["forward_ms"] + r["backward_ms"] - r["step_ms"]) < 1e-6, r
    assert r["peak_mem_bytes"] > 0 and r["optimizer_ms"] is None, r
    assert (r["comm_bytes"] > 0) == (r["mode"] is not None), r
    assert r["dp"] == (4 if r["mode"] is None else 1), r
print("benchmark --simulate json: ok")
PY
  # colossalai-sim missing: the error names both places.
  mkdir "$tmp/solo" && cp "$bin" "$tmp/solo/colossalai"
  set +e
  err=$(PATH=/usr/bin:/bin "$tmp/solo/colossalai" benchmark --gpus 4 --simulate \
    --cluster "$clusters/cpu-2.toml" "${fm[@]}" 2>&1); rc=$?
  set -e
  [ $rc -ne 0 ] && grep -q "neither beside this binary ($tmp/solo/colossalai-sim) nor on PATH" \
    <<<"$err" || { echo "missing colossalai-sim: $err"; exit 1; }
  # Measured beside simulated: from the JSON, then simulated on the spot.
  meas=(--gpus 4 --device cpu "${fm[@]}" -b 8 -w 1 -p 2)
  "$bin" benchmark "${meas[@]}" --compare "$tmp/sim.json" --json "$tmp/meas.json" \
    >"$tmp/cmp.txt" 2>"$tmp/cmp.err"
  # The plan's tensor-parallel bytes are what the layers sent.
  python3 - "$tmp/meas.json" "$tmp/sim.json" <<'PY'
import json, sys
key = lambda r: (r["mode"], r["size"], r["depth"])
meas = {key(r): r for r in json.load(open(sys.argv[1]))["layouts"]}
for s in json.load(open(sys.argv[2]))["layouts"]:
    m = meas[key(s)]
    assert m["simulated"] is False and m["status"] == "ok", m
    assert abs(s["comm_bytes"] - m["comm_bytes"]) <= 0.01 * m["comm_bytes"], (s, m)
print("simulated tensor-parallel bytes = measured: ok")
PY
  "$bin" benchmark "${meas[@]}" --compare --cluster "$clusters/cpu-2.toml" \
    >"$tmp/cmp2.txt" 2>"$tmp/cmp2.err"
  cat "$tmp/cmp.txt"
  for f in "$tmp/cmp.txt" "$tmp/cmp2.txt"; do
    grep -q "measured against .* (simulated)" "$f" || { echo "no comparison in $f"; exit 1; }
    for l in "none " "1d (size 4)" "2d (size 4)" "2.5d (size 4, depth 1)"; do
      grep -E "^$(sed 's/[().]/\\&/g' <<<"$l") +[0-9.]+ +[0-9.]+ +[-+][0-9.]+%" "$f" >/dev/null ||
        { echo "no compared row for '$l' in $f"; exit 1; }
    done
  done
  echo "colossalai benchmark (simulated): ok"
  exit 0
fi
set +e
err=$("$bin" benchmark 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q -- "--gpus is required" <<<"$err" || { echo "no --gpus: $err"; exit 1; }
set +e
err=$("$bin" benchmark --gpus 2 --model vit 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "needs --config" <<<"$err" || { echo "vit without config: $err"; exit 1; }

"$bin" benchmark --gpus 4 --device cpu -d 256 -s 64 -b 4 -w 1 -p 2 --json "$tmp/b4.json" \
  >"$tmp/b4.txt" 2>"$tmp/b4.err"
cat "$tmp/b4.txt"
"$bin" benchmark --gpus 8 --device cpu -d 256 -s 64 -b 4 -w 1 -p 2 --json "$tmp/b8.json" \
  >"$tmp/b8.txt" 2>"$tmp/b8.err"
cat "$tmp/b8.txt"
python3 - "$tmp/b4.json" "$tmp/b8.json" <<'PY'
import json, sys
def rows(path):
    return [(r["mode"], r["depth"], r["status"], r) for r in json.load(open(path))["layouts"]]
b4, b8 = rows(sys.argv[1]), rows(sys.argv[2])
assert sorted((m or "none", d) for m, d, _, _ in b4) == sorted(
    [("none", 1), ("1d", 1), ("2d", 1), ("2.5d", 1)]), b4
assert sorted((m or "none", d) for m, d, _, _ in b8) == sorted(
    [("none", 1), ("1d", 1), ("2.5d", 2), ("3d", 1)]), b8
# Bytes per step of 2 × Linear(256, 256) on [4, 64, 256] fp32 (nn/tensor_parallel_nd.cpp).
def nd_bytes(mode, size, depth):
    if mode == "3d":  # q 2: 1 sample of 64 tokens, features 128, weight [128, 64]
        R, I, O, q = 64, 128, 128, 2
        fwd = q * R * I * 4 + O * I * 4 + q * R * O * 4
        bwd = q * R * O * 4 + 2 * q * R * I * 4 + O * I * 4 + O * I * 4 + O * 4
        return 2 * (fwd + bwd)
    q = 2
    R, I, O = 4 // (q * depth) * 64, 128, 128
    fwd = q * (R * I * 4 + O * I * 4)  # q broadcasts along the row and the column
    bwd = q * O * I * 4 + 2 * q * R * I * 4 + q * O * I * 4 + (O * I * 4 if depth > 1 else 0)
    return 2 * (fwd + bwd + O * 4)
for m, d, s, r in b4 + b8:
    assert s == "ok", r
    assert r["forward_ms"] > 0 and r["backward_ms"] > 0 and r["peak_mem_bytes"] > 0, r
    assert r["simulated"] is False, r
    if m in (None, "1d"):
        # 1d: one all-reduce of the [4, 64, 256] fp32 output forward, one of the input gradient
        # backward; none: no communication.
        assert r["comm_bytes"] == (2 * 4 * 64 * 256 * 4 if m == "1d" else 0), r
    else:
        assert r["comm_bytes"] == nd_bytes(m, r["size"], d), (r, nd_bytes(m, r["size"], d))
# One definition of throughput: -b samples per data-parallel rank, `none` N-way data parallel
# (N·b samples a step), a tensor layout one group (b a step); per GPU beside it; achieved TFLOP/s
# from the plan's FLOPs; the peak measured per layout (the layouts hold different shards).
for path, g in ((sys.argv[1], 4), (sys.argv[2], 8)):
    rs = json.load(open(path))["layouts"]
    for r in rs:
        n = 4 * (g if r["mode"] is None else 1)
        assert abs(r["samples_per_s"] - 1e3 * n / r["step_ms"]) <= 1e-6 * r["samples_per_s"], r
        assert abs(r["samples_per_s_per_gpu"] * g - r["samples_per_s"]) <= 1e-6 * r["samples_per_s"], r
        assert r["tflops"] > 0, r
    assert len({r["peak_mem_bytes"] for r in rs}) > 1, [(r["mode"], r["peak_mem_bytes"]) for r in rs]
    sps = [r["samples_per_s"] for r in rs]
    assert sps == sorted(sps, reverse=True), sps  # the table's order: most samples/s first
print("benchmark json: ok")
PY
# More processes than cores: said up front, with the simulated alternative; progress per layout.
grep -q "8 processes share .* CPU core(s).*--simulate" "$tmp/b8.err" ||
  { echo "no oversubscription warning: $(cat "$tmp/b8.err")"; exit 1; }
grep -q "4 layout(s) on 4 cpu rank(s), 1 + 2 steps each" "$tmp/b4.err" ||
  { echo "no layout count: $(cat "$tmp/b4.err")"; exit 1; }
# Ctrl-C ends every rank: the launcher stops them and exits 130, no worker is left.
"$bin" benchmark --gpus 2 --device cpu -d 256 -s 64 -b 4 -w 1 -p 100000 >"$tmp/int.txt" \
  2>"$tmp/int.err" &
pid=$!
for _ in $(seq 60); do grep -q "step " "$tmp/int.err" && break; sleep 0.5; done
grep -q "step " "$tmp/int.err" || { echo "no progress line: $(cat "$tmp/int.err")"; exit 1; }
kill -INT $pid
set +e
wait $pid; rc=$?
set -e
[ $rc -eq 130 ] || { echo "SIGINT: exit $rc: $(cat "$tmp/int.err")"; exit 1; }
sleep 1
! pgrep -f "_benchmark_worker.*-p 100000" >/dev/null || { echo "a rank outlived SIGINT"; exit 1; }
# Every row measured: none skipped or failed in the printed tables.
! grep -Eq " (skipped|failed) " "$tmp/b4.txt" "$tmp/b8.txt" || { echo "a row was not measured"; exit 1; }
# Numbers out of range: the error names the flag, the value and what was expected.
for bad in "--gpus 0|--gpus: expected a number > 0, got 0" \
  "--gpus 2 -w -1|--warmup_steps: expected a number >= 0, got -1" \
  "--gpus 1 --calibrate-warmup 700|--calibrate-warmup: expected seconds from 0 to 600, got 700"; do
  args=${bad%%|*} want=${bad#*|}
  # shellcheck disable=SC2086
  if "$bin" benchmark $args >"$tmp/bad.txt" 2>&1; then echo "accepted: $args"; exit 1; fi
  grep -qF -- "$want" "$tmp/bad.txt" || { echo "$args: $(cat "$tmp/bad.txt")"; exit 1; }
done
echo "colossalai benchmark: ok"
