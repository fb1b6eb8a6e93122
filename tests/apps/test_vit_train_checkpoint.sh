#!/usr/bin/env bash
# vit_train checkpoints end to end: a run that saves every 2 steps, a resumed run that continues
# where the checkpoint stopped (2 processes, another layout: tensor parallel 2 instead of data
# parallel 2) and follows the uninterrupted run's losses (its metrics first say where it resumed),
# resuming the finished run (nothing to do: exit 0), --init-from, and a corrupt checkpoint named
# in the error.
#   test_vit_train_checkpoint.sh COLOSSALAI VIT_TRAIN CONFIG_DIR
set -euo pipefail
cai=$1; bin=$2; configs=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--config "$configs/fmnist_tiny.toml" --set data.train_subset=256
  --set data.eval_subset=64 --set train.num_epochs=2 --set train.batch_size=32
  --set train.num_workers=1 --set model.dropout=0.1)
# The uninterrupted run (2 processes, data parallel), saving every 2 steps, keeping 2.
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$tmp/ck" \
  --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 \
  --set train.metrics_file="$tmp/whole.jsonl" --set train.log_interval=1 >"$tmp/whole.log" 2>&1 ||
  { cat "$tmp/whole.log"; exit 1; }
ls "$tmp/ck"
[ "$(cat "$tmp/ck/latest")" = "step-000000008" ] || { echo "latest: $(cat "$tmp/ck/latest")"; exit 1; }
[ -d "$tmp/ck/step-000000006" ] && [ ! -d "$tmp/ck/step-000000004" ] || { echo "keep_last"; exit 1; }
# Resume step 6 (epoch 2, step 2 of 4) with tensor parallelism 2 instead of data parallelism 2.
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set parallel.tensor.mode=1d \
  --set parallel.tensor.size=2 --set train.batch_size=64 --resume "$tmp/ck/step-000000006" \
  --set train.metrics_file="$tmp/resumed.jsonl" --set train.log_interval=1 >"$tmp/resumed.log" 2>&1 ||
  { cat "$tmp/resumed.log"; exit 1; }
grep -q "resuming .*step-000000006" "$tmp/resumed.log" || { cat "$tmp/resumed.log"; exit 1; }
python3 - "$tmp/whole.jsonl" "$tmp/resumed.jsonl" <<'PY'
import json, sys
def steps(p):
    return {j["step"]: j["loss"] for j in map(json.loads, open(p)) if j["type"] == "step"}
whole, resumed = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(resumed) == [7, 8], resumed
for s, l in resumed.items():
    assert abs(l - whole[s]) <= 1e-5 * abs(whole[s]), (s, l, whole[s])
print("resumed losses follow the uninterrupted run:", resumed)
first = json.loads(open(sys.argv[2]).readline())  # appended after where it resumed
assert first["type"] == "resume" and first["step"] == 6, first
assert first["checkpoint"].endswith("/ck/step-000000006"), first
# Each run's layout as it ran: data parallel 2 × 32 samples, then tensor parallel 2 × 64.
run = json.loads(open(sys.argv[1]).readline())
assert run["type"] == "run" and (run["processes"], run["dp"], run["pp"], run["tp"]) == (2, 2, 1, 1), run
assert (run["batch_per_process"], run["global_batch"], run["device"]) == (32, 64, "cpu"), run
second = json.loads(open(sys.argv[2]).readlines()[1])
assert second["type"] == "run" and (second["dp"], second["tp"], second["tensor_mode"]) == (1, 2, "1d"), second
assert (second["batch_per_process"], second["global_batch"]) == (64, 64), second
PY
# Resuming the finished run (latest: step 8, the end of its 2 epochs) says so and exits 0, and the
# metrics file stays as it was (it was truncated, then the process died of a segfault).
cp "$tmp/whole.jsonl" "$tmp/finished.jsonl"
"$bin" "${common[@]}" --resume "$tmp/ck" --set train.metrics_file="$tmp/finished.jsonl" \
  >"$tmp/finished.log" 2>&1 || { echo "resuming the finished run: exit $?"; cat "$tmp/finished.log"; exit 1; }
grep -q "step-000000008 (global step 8) already ends the run's 2 epochs: training is complete" \
  "$tmp/finished.log" || { cat "$tmp/finished.log"; exit 1; }
cmp "$tmp/whole.jsonl" "$tmp/finished.jsonl" || { echo "the finished run's metrics changed"; exit 1; }
# Fine-tuning start from the saved weights.
"$bin" "${common[@]}" --set train.num_epochs=1 --set data.train_subset=64 \
  --init-from "$tmp/ck/step-000000008" >"$tmp/init.log" 2>&1 ||
  { cat "$tmp/init.log"; exit 1; }
grep -q "initialised from" "$tmp/init.log"
# A corrupt checkpoint: the error names the file.
cp -r "$tmp/ck/step-000000008" "$tmp/bad"
head -c 100 "$tmp/ck/step-000000008/model.safetensors" >"$tmp/bad/model.safetensors"
set +e
err=$("$bin" "${common[@]}" --resume "$tmp/bad" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "bad/model.safetensors" <<<"$err" || { echo "corrupt: $err"; exit 1; }
# Per-rank checkpoints: each of 2 ZeRO-3 ranks writes its shards; one process resumes them and
# follows the 2-process run; the weights export to timm-named safetensors that --init-from reads.
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set train.num_epochs=1 \
  --set parallel.zero_stage=3 --set checkpoint.dir="$tmp/pr" --set checkpoint.every_steps=2 \
  --set checkpoint.per_rank=true --set train.metrics_file="$tmp/pr2.jsonl" \
  --set train.log_interval=1 >"$tmp/pr2.log" 2>&1 || { cat "$tmp/pr2.log"; exit 1; }
for f in checkpoint.index.json trainer_state.json model-rank00001-of-00002.safetensors \
    optimizer-rank00000-of-00002.safetensors; do
  [ -f "$tmp/pr/step-000000002/$f" ] || { ls "$tmp/pr/step-000000002"; exit 1; }
done
"$bin" "${common[@]}" --set train.num_epochs=1 --set train.batch_size=64 \
  --resume "$tmp/pr/step-000000002" --set train.metrics_file="$tmp/pr1.jsonl" \
  --set train.log_interval=1 >"$tmp/pr1.log" 2>&1 || { cat "$tmp/pr1.log"; exit 1; }
python3 - "$tmp/pr2.jsonl" "$tmp/pr1.jsonl" <<'PY'
import json, sys
def steps(p):
    return {j["step"]: j["loss"] for j in map(json.loads, open(p)) if j["type"] == "step"}
whole, resumed = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(resumed) == [3, 4], resumed
for s, l in resumed.items():
    assert abs(l - whole[s]) <= 1e-5 * abs(whole[s]), (s, l, whole[s])
print("per-rank ZeRO-3 (2 processes) resumed by 1 process:", resumed)
PY
"$bin" "${common[@]}" --resume "$tmp/pr" --export-to "$tmp/export" >"$tmp/export.log" 2>&1 ||
  { cat "$tmp/export.log"; exit 1; }
[ -f "$tmp/export/model.safetensors" ] || { ls "$tmp/export"; exit 1; }
"$bin" "${common[@]}" --set train.num_epochs=1 --set data.train_subset=64 \
  --init-from "$tmp/export" >"$tmp/init2.log" 2>&1 || { cat "$tmp/init2.log"; exit 1; }
grep -q "initialised from" "$tmp/init2.log"
# A per-rank checkpoint with a shard missing: the error names the file.
cp -r "$tmp/pr/step-000000004" "$tmp/bad_pr"
rm "$tmp/bad_pr/model-rank00001-of-00002.safetensors"
set +e
err=$("$bin" "${common[@]}" --resume "$tmp/bad_pr" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "bad_pr/model-rank00001-of-00002.safetensors, which does not exist" <<<"$err" ||
  { echo "missing shard: $err"; exit 1; }
echo "vit_train checkpoints: ok"
