#!/usr/bin/env bash
# A rank killed in the middle of a checkpoint save, under `colossalai run`: the job ends with a
# message naming the dead rank, the previous checkpoint stays `latest` and loadable, and a run
# resumed from the directory follows the uninterrupted run's losses. Both formats: per-rank
# (rank 1 dies after writing its first shard of step 4) and consolidated (rank 0, the writer,
# dies after its first file of step 4). The kill comes from kill_in_save.so (LD_PRELOAD, SIGKILL
# after a matching fsync), so it lands at the same point every run.
#   test_vit_train_killed_save.sh COLOSSALAI VIT_TRAIN CONFIG_DIR KILL_IN_SAVE_SO
set -euo pipefail
cai=$1; bin=$2; configs=$3; so=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--config "$configs/fmnist_tiny.toml" --set data.train_subset=256
  --set data.eval_subset=64 --set train.num_epochs=2 --set train.batch_size=32
  --set train.num_workers=1 --set model.dropout=0.1 --set train.log_interval=1
  --set checkpoint.every_steps=2 --set checkpoint.keep_last=3)
steps() {
  python3 -c 'import json,sys; print(json.dumps({j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1])) if j["type"] == "step"}))' "$1"
}
# The uninterrupted run: 8 steps (4 per epoch), the reference losses.
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$tmp/ref" \
  --set train.metrics_file="$tmp/ref.jsonl" >"$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; exit 1; }
for fmt in per_rank consolidated; do
  victim=1
  [ $fmt = consolidated ] && victim=0
  pr=false
  [ $fmt = per_rank ] && pr=true
  ck=$tmp/ck_$fmt
  set +e
  "$cai" run --nproc_per_node 2 -x LD_PRELOAD="$so" -x KILL_IN_SAVE_RANK=$victim \
    -x KILL_IN_SAVE_PATH=step-000000004.tmp/ "$bin" "${common[@]}" --set checkpoint.dir="$ck" \
    --set checkpoint.per_rank=$pr --set train.metrics_file="$tmp/killed_$fmt.jsonl" \
    >"$tmp/killed_$fmt.log" 2>&1
  rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "$fmt: the job with a killed rank exited 0"; cat "$tmp/killed_$fmt.log"; exit 1; }
  grep -q "kill_in_save: rank $victim kills itself after the fsync of .*step-000000004.tmp/" \
    "$tmp/killed_$fmt.log" || { echo "$fmt: the fault did not fire"; cat "$tmp/killed_$fmt.log"; exit 1; }
  grep -q "rank $victim .*killed by signal 9 (SIGKILL)" "$tmp/killed_$fmt.log" ||
    { echo "$fmt: the launcher did not name rank $victim"; cat "$tmp/killed_$fmt.log"; exit 1; }
  # The previous checkpoint is what `latest` names; the interrupted one never became a checkpoint.
  [ "$(cat "$ck/latest")" = "step-000000002" ] || { echo "$fmt: latest is $(cat "$ck/latest")"; ls -la "$ck"; exit 1; }
  [ ! -e "$ck/step-000000004" ] || { echo "$fmt: step-000000004 was committed"; ls -la "$ck"; exit 1; }
  [ -f "$ck/step-000000002/trainer_state.json" ] || { ls -la "$ck/step-000000002"; exit 1; }
  if [ -d "$ck/step-000000004.tmp" ]; then
    [ ! -f "$ck/step-000000004.tmp/trainer_state.json" ] || { echo "$fmt: the .tmp has trainer_state.json"; exit 1; }
    set +e
    err=$("$bin" "${common[@]}" --set checkpoint.dir="$tmp/unused" --resume "$ck/step-000000004.tmp" 2>&1)
    rc=$?
    set -e
    [ $rc -ne 0 ] && grep -q "holds no checkpoint" <<<"$err" || { echo "$fmt: the .tmp loaded: $err"; exit 1; }
  fi
  # Resume from the directory (latest = step 2) and finish the run: the losses of steps 3-8
  # are the uninterrupted run's.
  "$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$ck" \
    --set checkpoint.per_rank=$pr --resume "$ck" --set train.metrics_file="$tmp/resumed_$fmt.jsonl" \
    >"$tmp/resumed_$fmt.log" 2>&1 || { cat "$tmp/resumed_$fmt.log"; exit 1; }
  grep -q "resuming .*step-000000002" "$tmp/resumed_$fmt.log" || { cat "$tmp/resumed_$fmt.log"; exit 1; }
  python3 - "$(steps "$tmp/ref.jsonl")" "$(steps "$tmp/resumed_$fmt.jsonl")" "$fmt" <<'PY'
import json, sys
ref, res = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert sorted(res, key=int) == [str(s) for s in range(3, 9)], res
for s, l in res.items():
    assert abs(l - ref[s]) <= 1e-5 * abs(ref[s]), (s, l, ref[s])
print(f"{sys.argv[3]}: killed during step 4's save, resumed from step 2, steps 3-8 follow the "
      f"uninterrupted run: {res}")
PY
  [ "$(cat "$ck/latest")" = "step-000000008" ] || { echo "$fmt: after the resume latest is $(cat "$ck/latest")"; exit 1; }
done
