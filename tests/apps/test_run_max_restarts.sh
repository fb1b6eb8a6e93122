#!/usr/bin/env bash
# colossalai run --max_restarts end to end (2 CPU ranks through mpirun):
#  - vit_train whose rank 1 is SIGKILLed after its second checkpoint restarts once with --resume,
#    finishes, and its final weights equal an uninterrupted run's byte for byte;
#  - vit_train whose rank 0 is SIGKILLed in its first save (kill_in_save.so, once) restarts as
#    first started (this job's incomplete step-*.tmp removed: no complete checkpoint yet) and
#    also ends with the uninterrupted run's weights;
#  - --max_restarts 0: a failing rank ends the job as without the flag;
#  - a rank that fails once (no checkpoint.dir): restarted with the same command, exit 0;
#  - a rank that always fails: gives up after 2 restarts listing 3 failures (also --hostfile).
# After every case no process of the test may be left.
#   test_run_max_restarts.sh COLOSSALAI VIT_TRAIN CONFIG_DIR KILL_IN_SAVE_SO
set -uo pipefail
cai=${1:?path to colossalai}; bin=${2:?path to vit_train}; configs=${3:?config dir}
so=${4:?path to kill_in_save.so}
source "$(dirname "$0")/run_case_lib.sh"
common=(--config "$configs/fmnist_tiny.toml" --set data.train_subset=256
  --set data.eval_subset=64 --set train.num_epochs=4 --set train.batch_size=32
  --set train.num_workers=1 --set model.dropout=0.1 --set train.log_interval=1
  --set checkpoint.every_steps=2 --set checkpoint.keep_last=3)

case=reference  # uninterrupted: 16 steps (4 per epoch), a checkpoint every 2
log=$tmp/ref.log
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set checkpoint.dir="$tmp/ref" >"$log" 2>&1
rc=$?
show
[ $rc -eq 0 ] || fail "the uninterrupted run failed"

case=killed_rank_restarts
log=$tmp/killed.log
ck=$tmp/ck
"$cai" run --nproc_per_node 2 --max_restarts 2 --monitor_interval 1 "$bin" "${common[@]}" \
  --set checkpoint.dir="$ck" >"$log" 2>&1 &
job=$!
# Rank 1's vit_train (its environment says OMPI_COMM_WORLD_RANK=1, its command line names $ck)
# gets SIGKILL once the second checkpoint (step 4) is complete (or a later one, before the last,
# should the poll miss step 4).
killed=""
for _ in $(seq 1 1200); do
  latest=$(cat "$ck/latest" 2>/dev/null)
  n=0
  [ -n "$latest" ] && n=$((10#${latest#step-}))
  if [ -n "$latest" ] && [ "$n" -ge 4 ] && [ "$n" -lt 16 ]; then
    for pid in $(pgrep -x vit_train); do
      if grep -qF -- "$ck" "/proc/$pid/cmdline" 2>/dev/null &&
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then
        kill -KILL "$pid" && killed=$pid
      fi
    done
    break
  fi
  kill -0 $job 2>/dev/null || break
  sleep 0.05
done
wait $job
rc=$?
show
[ -n "$killed" ] || fail "rank 1 was not found to kill after step 4 (latest: $(cat "$ck/latest" 2>/dev/null))"
[ $rc -eq 0 ] || fail "exit $rc, expected 0"
expect "attempt 1 failed: rank 1 \(host [^)]*\) failed: killed by signal 9 \(SIGKILL\); all ranks stopped; restart 1 of 2"
expect "restart 1 of 2 \(--max_restarts 2\) with --resume \(newest complete checkpoint: .*/ck/step-0000000(04|06|08|10|12|14)\)"
expect "resuming .*/ck/step-0000000(04|06|08|10|12|14) "
expect "the job succeeded after 1 restart \(--max_restarts 2\)"
expect_not "restart 2 of 2"
[ "$(cat "$ck/latest" 2>/dev/null)" = step-000000016 ] || fail "latest is $(cat "$ck/latest" 2>/dev/null)"
cmp "$tmp/ref/step-000000016/model.safetensors" "$ck/step-000000016/model.safetensors" ||
  fail "the final weights differ from the uninterrupted run's"
cmp "$tmp/ref/step-000000016/optimizer.safetensors" "$ck/step-000000016/optimizer.safetensors" ||
  fail "the final optimizer state differs from the uninterrupted run's"
leftovers

case=killed_in_first_save
log=$tmp/first_save.log
ck=$tmp/ck_first
"$cai" run --nproc_per_node 2 --max_restarts 1 -x LD_PRELOAD="$so" -x KILL_IN_SAVE_RANK=0 \
  -x KILL_IN_SAVE_PATH=step-000000002.tmp/ -x KILL_IN_SAVE_ONCE="$tmp/fired" "$bin" \
  "${common[@]}" --set checkpoint.dir="$ck" >"$log" 2>&1
rc=$?
show
[ $rc -eq 0 ] || fail "exit $rc, expected 0"
expect "kill_in_save: rank 0 kills itself after the fsync of .*step-000000002.tmp/"
expect "attempt 1 failed: rank 0 \(host [^)]*\) failed: killed by signal 9 \(SIGKILL\); all ranks stopped; restart 1 of 1 \(--max_restarts 1\) with the same command \(.*/ck_first holds no complete checkpoint yet"
# (the fault leaves step-000000002.tmp, which a new run would be refused: the launcher removes it)
expect "holds no complete checkpoint yet\) after removing this job's incomplete save step-000000002.tmp$"
expect_not "resuming "
expect "the job succeeded after 1 restart \(--max_restarts 1\)"
cmp "$tmp/ref/step-000000016/model.safetensors" "$ck/step-000000016/model.safetensors" ||
  fail "the final weights differ from the uninterrupted run's"
leftovers

# A rank-1 failure as a shell command: rank 1 exits 3 (or, with $1, only while $1 is missing:
# it creates it first), rank 0 waits for the launcher to stop it.
fails_on_rank1='if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then if [ -z "$1" ] || [ ! -e "$1" ]; then [ -n "$1" ] && touch "$1"; exit 3; fi; exit 0; fi; [ -n "$1" ] && [ -e "$1" ] && exit 0; sleep 60'

case=max_restarts_0
log=$tmp/zero.log
"$cai" run --nproc_per_node 2 --max_restarts 0 sh -c "$fails_on_rank1" "$tmp" "" >"$log" 2>&1
rc=$?
show
[ $rc -eq 3 ] || fail "exit $rc, expected 3"
expect "colossalai run: rank 1 \(host [^)]*\) failed: exit code 3; all ranks stopped"
expect_not "restart [0-9]+ of|attempt [0-9]+"
leftovers

case=fails_once
log=$tmp/once.log
"$cai" run --nproc_per_node 2 --max_restarts 2 sh -c "$fails_on_rank1" "$tmp" "$tmp/once" >"$log" 2>&1
rc=$?
show
[ $rc -eq 0 ] || fail "exit $rc, expected 0"
expect "attempt 1 failed: rank 1 \(host [^)]*\) failed: exit code 3; all ranks stopped; restart 1 of 2 \(--max_restarts 2\) with the same command"
expect "the job succeeded after 1 restart"
leftovers

printf 'localhost slots=2  # this machine\n' >"$tmp/hostfile"
for hosts in "" "--hostfile $tmp/hostfile"; do
  case="always_fails${hosts:+ (hostfile)}"
  log=$tmp/always.log
  # shellcheck disable=SC2086
  "$cai" run --nproc_per_node 2 $hosts --max_restarts 2 --monitor_interval 0.5 sh -c "$fails_on_rank1" "$tmp" "" \
    >"$log" 2>&1
  rc=$?
  show
  [ $rc -eq 3 ] || fail "exit $rc, expected 3"
  expect "restart 1 of 2"
  expect "restart 2 of 2"
  expect "attempt 3 failed: rank 1 \(host [^)]*\) failed: exit code 3; all ranks stopped$"
  expect "giving up after 2 restarts \(--max_restarts 2\); 3 failures:"
  for a in 1 2 3; do expect "^  attempt $a: rank 1 \(host [^)]*\): exit code 3$"; done
  [ "$(grep -c "rank 1 on host .* exited with code 3" "$log")" = 3 ] || fail "rank 1 did not run 3 times"
  leftovers
done

finish "--max_restarts"
