#!/usr/bin/env bash
# A 4-process pipeline run of the Fashion-MNIST job through `colossalai run` writes a valid
# Chrome-trace JSON with 4 tracks (one per rank) holding every schedule instruction and memory
# samples, and prints the measured bubble fraction of each stage beside the ideal one.
set -euo pipefail
colossalai=${1:?colossalai}; vit_train=${2:?vit_train}; configs=${3:?config dir}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$(CAI_COLLECTIVE_TIMEOUT=120 "$colossalai" run --nproc_per_node 4 --timeout 600 "$vit_train" \
  --config "$configs/fmnist_tiny.toml" --set parallel.pipeline=4 --set parallel.num_microbatches=4 \
  --set train.num_epochs=1 --set train.max_steps_per_epoch=6 --set data.train_subset=2048 \
  --set data.eval_subset=256 --set train.num_workers=0 --trace "$work/trace.json" 2>&1)
echo "$out" | grep -E "trace written|measured bubble"
grep -q "ideal bubble 0.429" <<<"$out"  # 1F1B, p = 4, m = 4: (p-1)/(m+p-1) = 3/7
[ "$(grep -c "measured bubble" <<<"$out")" -eq 4 ]
python3 - "$work/trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
tracks = sorted({e["tid"] for e in events})
assert tracks == [0, 1, 2, 3], tracks
for t in tracks:
    names = {e["name"].split("(")[0] for e in events if e["tid"] == t and e["ph"] == "X"}
    assert {"F", "B", "ReduceGrads", "OptStep", "step"} <= names, (t, names)
    assert any(e["ph"] == "C" for e in events if e["tid"] == t), t
    spans = [e for e in events if e["tid"] == t and e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
sends = sum(1 for e in events if e["name"].startswith("SendAct"))
recvs = sum(1 for e in events if e["name"].startswith("RecvAct"))
assert sends == recvs == 3 * 4 * 6, (sends, recvs)  # 3 boundaries x 4 micro-batches x 6 steps
print(f"trace ok: {len(events)} events on {len(tracks)} tracks")
PY
