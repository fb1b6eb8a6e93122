#!/usr/bin/env bash
# colossalai benchmark end to end on CPU processes: the layouts of 4 and 8 ranks, measured rows
# for none and 1d, the other modes listed as skipped with their reason, the JSON, and errors.
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
for m, d, s, r in b4 + b8:
    if m in (None, "1d"):
        assert s == "ok", r
        assert r["forward_ms"] > 0 and r["backward_ms"] > 0 and r["peak_mem_bytes"] > 0, r
        assert r["simulated"] is False, r
        # 1d: one all-reduce of the [4, 64, 256] fp32 output forward, one of the input gradient
        # backward; none: no communication.
        assert r["comm_bytes"] == (2 * 4 * 64 * 256 * 4 if m == "1d" else 0), r
    else:
        assert s == "skipped" and "not built yet" in r["reason"], r
print("benchmark json: ok")
PY
# The measured rows come first in the printed table, best first.
head -3 "$tmp/b4.txt" | tail -1 | grep -Eq "^(none|1d)" || { echo "table order"; exit 1; }
echo "colossalai benchmark: ok"
