#!/usr/bin/env bash
# vit_train end to end with the zero-bubble ZB-V schedule on 2 processes (Fashion-MNIST job):
# the dry run's plan places rank 0's chunks in a V (the first and the last layers), the run
# trains, and its trace holds the split backward (BI and BW spans) on both tracks, the measured
# bubble and peak memory of both stages.
set -euo pipefail
colossalai=${1:?colossalai}; vit_train=${2:?vit_train}; configs=${3:?config dir}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sets=(--set parallel.pipeline=2 --set parallel.pp_style=zbv --set parallel.num_model_chunks=2
  --set parallel.num_microbatches=4 --set train.num_epochs=1 --set train.max_steps_per_epoch=4
  --set data.train_subset=1024 --set data.eval_subset=128 --set train.num_workers=0)
plan=$("$vit_train" --config "$configs/fmnist_tiny.toml" "${sets[@]}" --dry-run --nproc 2)
# depth 4: 6 layers over 4 virtual stages (embedding + block 0, block 1, block 2, block 3 +
# head): rank 0 holds vs 0 and 3, rank 1 vs 1 and 2.
grep -E "stage 0 \(layers 0-1, 4-5\)" <<<"$plan" >/dev/null || { echo "$plan"; exit 1; }
grep -E "stage 1 \(layers 2-3\)" <<<"$plan" >/dev/null || { echo "$plan"; exit 1; }
out=$(CAI_COLLECTIVE_TIMEOUT=120 "$colossalai" run --nproc_per_node 2 --timeout 600 "$vit_train" \
  --config "$configs/fmnist_tiny.toml" "${sets[@]}" --trace "$work/trace.json" 2>&1)
echo "$out" | grep -E "finished|trace written|measured bubble"
grep -q "schedule zbv with 2 stages" <<<"$out"
[ "$(grep -c "measured bubble .*, peak memory [0-9]* bytes" <<<"$out")" -eq 2 ]
python3 - "$work/trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
for t in (0, 1):
    names = [e["name"] for e in events if e["tid"] == t and e["ph"] == "X"]
    kinds = {n.split("(")[0] for n in names}
    assert {"F", "BI", "BW", "ReduceGrads", "OptStep"} <= kinds and "B" not in kinds, (t, kinds)
    # Two chunks per rank, each micro-batch's F, BI and BW once per chunk: 4 x 2 per step.
    assert sum(n.startswith("BW(") for n in names) == 4 * 2 * 4, (t, len(names))
# Rank 1 holds vs 1 and 2: its chunks pass locally, so it only talks to rank 0.
assert all("->0" in e["name"] for e in events if e["tid"] == 1 and e["name"].startswith("Send"))
print("zbv trace ok")
PY
