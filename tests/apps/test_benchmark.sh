#!/usr/bin/env bash
# colossalai benchmark end to end on CPU processes: the layouts of 4 and 8 ranks, every one
# measured (none, 1d, 2d, 2.5d, 3d), the bytes each mode's collectives carried, the JSON, errors.
#   test_benchmark.sh COLOSSALAI
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
print("benchmark json: ok")
PY
# Every row measured: none skipped or failed in the printed tables.
! grep -Eq " (skipped|failed) " "$tmp/b4.txt" "$tmp/b8.txt" || { echo "a row was not measured"; exit 1; }
echo "colossalai benchmark: ok"
