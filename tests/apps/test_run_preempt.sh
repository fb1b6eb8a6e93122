#!/usr/bin/env bash
# Preemption end to end (2 CPU ranks through colossalai run and mpirun):
#  - SIGTERM to the launcher mid-run: every rank finishes its step, they stop together at one
#    step boundary with a checkpoint there (`latest`, trainer_state.json's global_step and the
#    metrics file's "preempted" record all name the same step), the ranks exit 0, the launcher
#    exits 0 and says every rank stopped within the grace period; `--resume` then finishes the
#    run and its weights, optimizer state and per-step losses equal an uninterrupted run's;
#  - SIGUSR1 (SLURM's warning signal): the same, the record says SIGUSR1;
#  - SIGTERM to rank 1's vit_train alone (the signal reaches one rank): both ranks stop at the
#    same boundary and exit 0 (not restarted: nothing failed); --resume then ends with the
#    uninterrupted run's weights;
#  - a program that ignores SIGTERM is stopped by force after --grace_period, exit 143;
#  - SIGUSR1 sent to mpirun itself (not the launcher): the wrappers report the stop, exit 138.
# After every case no process of the test may be left.
#   test_run_preempt.sh COLOSSALAI VIT_TRAIN CONFIG_DIR [--set KEY=VALUE ...]
# (the extra arguments go to every vit_train, e.g. --set train.device=cuda on a GPU host)
set -uo pipefail
cai=${1:?path to colossalai}; bin=${2:?path to vit_train}; configs=${3:?config dir}
shift 3
show_skip='step +[0-9]+/[0-9]+ '  # show: without the progress lines
source "$(dirname "$0")/run_case_lib.sh"
# 16 steps per epoch (1024 samples, global batch 64), 3 epochs, a checkpoint every 8 steps.
common=(--config "$configs/fmnist_tiny.toml" --set data.train_subset=1024
  --set data.eval_subset=64 --set train.num_epochs=3 --set train.batch_size=32
  --set train.num_workers=1 --set model.dropout=0.1 --set train.log_interval=1
  --set checkpoint.every_steps=8 --set checkpoint.keep_last=2 "$@")
last=step-000000048

# The global step of the newest "step" record in metrics file $1 (0 when none yet).
newest_step() {
  python3 - "$1" <<'PY' 2>/dev/null || echo 0
import json, sys
n = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "step": n = r["step"]
print(n)
PY
}
# Waits until metrics file $1 has a step record >= $2 (or job $3 ended).
wait_for_step() {
  for _ in $(seq 1 1200); do
    [ "$(newest_step "$1")" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# Per-step losses of metrics file $1 after global step $2, as "step loss" lines.
losses_after() {
  python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "step" and r["step"] > int(sys.argv[2]): print(r["step"], repr(r["loss"]))
PY
}
# Checks that checkpoint dir $1's latest, its trainer_state.json and metrics file $2's preempted
# record name one step, with signal $3; prints the step.
stopped_step() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
ck, metrics, sig = sys.argv[1:4]
latest = open(ck + "/latest").read().strip()
state = json.load(open(f"{ck}/{latest}/trainer_state.json"))
rec = [json.loads(l) for l in open(metrics) if '"preempted"' in l]
assert len(rec) == 1, f"{len(rec)} preempted records"
rec = rec[0]
assert rec["signal"] == sig, rec
assert rec["step"] == state["global_step"] == int(latest[5:]), (rec, state, latest)
assert rec["step_in_epoch"] == state["step_in_epoch"] and rec["epoch"] == state["epoch"] + 1, (rec, state)
assert 0 < rec["step"] < 48, rec
print(rec["step"])
PY
}

case=reference
log=$tmp/ref.log
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$tmp/ref" \
  --set train.metrics_file="$tmp/ref.jsonl" >"$log" 2>&1
rc=$?
show
[ $rc -eq 0 ] || fail "the uninterrupted run failed"

for sig in TERM USR1; do
  case="SIG$sig to the launcher"
  log=$tmp/$sig.log
  ck=$tmp/ck_$sig
  m=$tmp/$sig.jsonl
  "$cai" run --nproc_per_node 2 --max_restarts 2 "$bin" "${common[@]}" --set checkpoint.dir="$ck" \
    --set train.metrics_file="$m" >"$log" 2>&1 &
  job=$!
  wait_for_step "$m" 5 $job || fail "the job did not reach step 5"
  kill -$sig $job
  wait $job
  rc=$?
  show
  want=0  # a clean stop: every rank saved at one step boundary
  [ $rc -eq "$want" ] || fail "exit $rc, expected $want"
  expect "colossalai run: got SIG$sig: passing it to every rank and waiting up to 60 s \(--grace_period\)"
  expect "stopped on request \(SIG$sig\): every rank stopped after global step [0-9]+ .*checkpoint .*/ck_$sig/step-0+[0-9]+; continue with --resume; exit status $want"
  expect "\[colossalai run\] rank 0 on host \S+ stopped on request \(SIG$sig\): exited with code $want"
  expect "\[colossalai run\] rank 1 on host \S+ stopped on request \(SIG$sig\): exited with code $want"
  expect "colossalai run: stopped on request \(SIG$sig\): every rank \(2 of 2\) stopped within the grace period \(ranks 0, 1: exited with code $want\)"
  ! grep -qE "restart [0-9]+ of" "$log" || fail "a preempted job was restarted"
  n=$(stopped_step "$ck" "$m" "SIG$sig") || fail "checkpoint, trainer state and metrics disagree"
  echo "    stopped at global step ${n:-?}"
  leftovers

  case="resume after SIG$sig"
  log=$tmp/$sig.resume.log
  "$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$ck" \
    --set train.metrics_file="$m" --resume >"$log" 2>&1
  rc=$?
  show
  [ $rc -eq 0 ] || fail "exit $rc, expected 0"
  expect "resuming .*/ck_$sig/step-0+${n:-x} "
  [ "$(cat "$ck/latest" 2>/dev/null)" = $last ] || fail "latest is $(cat "$ck/latest" 2>/dev/null)"
  for f in model optimizer; do
    cmp "$tmp/ref/$last/$f.safetensors" "$ck/$last/$f.safetensors" ||
      fail "the final $f state differs from the uninterrupted run's"
  done
  [ "$(losses_after "$m" "${n:-0}")" = "$(losses_after "$tmp/ref.jsonl" "${n:-0}")" ] ||
    fail "the resumed run's losses differ from the uninterrupted run's"
  grep -q '"type": *"resume"' "$m" || grep -q '"type":"resume"' "$m" || fail "no resume record"
  leftovers
done

case="SIGTERM to rank 1 only"
# As SLURM or a node agent may signal the programs and not the launcher: both ranks stop at one
# step boundary and exit 0 (no restart: nothing failed), then --resume finishes the run.
log=$tmp/rank1.log
ck=$tmp/ck_rank1
m=$tmp/rank1.jsonl
"$cai" run --nproc_per_node 2 --max_restarts 1 "$bin" "${common[@]}" --set checkpoint.dir="$ck" \
  --set train.metrics_file="$m" >"$log" 2>&1 &
job=$!
wait_for_step "$m" 5 $job || fail "the job did not reach step 5"
sent=""
for pid in $(pgrep -x vit_train); do
  if grep -qF -- "$ck" "/proc/$pid/cmdline" 2>/dev/null &&
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then
    kill -TERM "$pid" && sent=$pid
  fi
done
wait $job
rc=$?
show
[ -n "$sent" ] || fail "rank 1's vit_train was not found"
[ $rc -eq 0 ] || fail "exit $rc, expected 0"
expect "stopped on request \(SIGTERM\): every rank stopped after global step [0-9]+"
! grep -qE "restart [0-9]+ of" "$log" || fail "a cleanly stopped job was restarted"
grep -q '"preempted"' "$m" || fail "no preempted record"
n=$(stopped_step "$ck" "$m" "SIGTERM") || fail "checkpoint, trainer state and metrics disagree"
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$ck" \
  --set train.metrics_file="$m" --resume >"$log.resume" 2>&1 || fail "the resumed run failed"
for f in model optimizer; do
  cmp "$tmp/ref/$last/$f.safetensors" "$ck/$last/$f.safetensors" ||
    fail "the final $f state differs from the uninterrupted run's"
done
leftovers

case="grace period runs out"
log=$tmp/grace.log
start=$(date +%s)
"$cai" run --nproc_per_node 2 --grace_period 1 sh -c 'trap "" TERM; echo ready; sleep 60; echo "$1"' \
  "$tmp" >"$log" 2>&1 &
job=$!
for _ in $(seq 1 200); do [ "$(grep -c ready "$log")" -ge 2 ] && break; sleep 0.05; done
kill -TERM $job
wait $job
rc=$?
show
[ $rc -eq 143 ] || fail "exit $rc, expected 143"
[ $(($(date +%s) - start)) -lt 20 ] || fail "took $(($(date +%s) - start)) s"
expect "the ranks did not all stop within 1 s \(--grace_period\): stopping them"
expect "colossalai run: stopped on request \(SIGTERM\): 0 of 2 ranks stopped within the grace period; the others were stopped by force after --grace_period 1 s"
leftovers

case="SIGUSR1 to mpirun directly"
log=$tmp/mpirun_usr1.log
"$cai" run --nproc_per_node 2 sh -c 'trap "exit 3" USR1; echo ready; while :; do sleep 0.1; done' \
  "$tmp" >"$log" 2>&1 &
job=$!
for _ in $(seq 1 200); do [ "$(grep -c ready "$log")" -ge 2 ] && break; sleep 0.05; done
mpirun_pid=$(pgrep -f "mpirun .*_rank_wrapper sh -c .* $tmp\$" | head -1)
[ -n "$mpirun_pid" ] && kill -USR1 "$mpirun_pid"
wait $job
rc=$?
show
[ -n "$mpirun_pid" ] || fail "mpirun not found"
[ $rc -eq 138 ] || fail "exit $rc, expected 138"
expect "colossalai run: stopped on request \(SIGUSR1\): every rank \(2 of 2\) stopped within the grace period \(ranks 0, 1: exited with code 3\)"
leftovers

finish "preemption"
