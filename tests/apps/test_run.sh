#!/usr/bin/env bash
# colossalai run end to end on this machine (mpirun, 2 ranks): output and environment, --dry-run,
# a failing rank (exit code, signal), --timeout, SIGTERM/SIGINT to the launcher, bad flags; after
# every case no rank_probe or rank wrapper may be left.
#   bash tests/apps/test_run.sh build/apps/colossalai build/tests/rank_probe
set -uo pipefail
bin=${1:?path to colossalai}
probe=${2:?path to rank_probe}
# The launcher adds --allow-run-as-root itself when run as root; these cover a plain mpirun too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
start_all=$SECONDS

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# run NAME CMD...: runs CMD, stores its output (both streams) in $out, exit code in $rc, wall
# time in $secs.
run() {
  local name=$1
  shift
  local t0=$(date +%s.%N)
  out=$("$@" 2>&1)
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "--- $name: exit $rc in ${secs}s"
  echo "$out" | sed 's/^/    /'
}
expect() {  # expect PATTERN: $out contains PATTERN (fixed string)
  grep -qF -- "$1" <<<"$out" || fail "$case: output lacks '$1'"
}
expect_rc() {
  [[ $rc == "$1" ]] || fail "$case: exit code $rc, expected $1"
}
expect_faster() {  # expect_faster SECONDS
  awk -v s="$secs" -v m="$1" 'BEGIN { exit !(s < m) }' || fail "$case: took ${secs}s (limit $1 s)"
}
# No probe (by process name) and no wrapper may survive a case; allow a few seconds to die.
no_leftovers() {
  for _ in $(seq 50); do
    if ! pgrep -x rank_probe >/dev/null && ! pgrep -f "_rank_wrapper" >/dev/null; then return; fi
    sleep 0.1
  done
  fail "$case: processes left behind: $(pgrep -a -x rank_probe; pgrep -af _rank_wrapper)"
  pkill -KILL -x rank_probe || true
}

case=print
SECRET_TOKEN=do-not-leak run "$case" "$bin" run --nproc_per_node 2 -x EXTRA=42 "$probe" --print \
  --env SECRET_TOKEN --env EXTRA --env CAI_NUM_THREADS --env RANK --env WORLD_SIZE
expect_rc 0
expect "rank 0 of 2 host"
expect "rank 1 of 2 host"
expect "MASTER_ADDR=127.0.0.1 MASTER_PORT=29500"
expect "SECRET_TOKEN=<unset>"
expect "EXTRA=42"
expect "RANK=1 WORLD_SIZE=2"
grep -q "CAI_NUM_THREADS=[0-9]" <<<"$out" || fail "$case: CAI_NUM_THREADS not set"
grep -q "do-not-leak" <<<"$out" && fail "$case: SECRET_TOKEN reached a rank"
no_leftovers

case=program-flags
run "$case" "$bin" run --nproc_per_node 1 --master_port 29611 -- "$probe" --print --env MASTER_PORT
expect_rc 0
expect "rank 0 of 1 host"
expect "MASTER_PORT=29611"

case=dry-run
run "$case" "$bin" run --nproc_per_node 2 --dry-run "$probe" --print
expect_rc 0
expect "mpirun"
expect "-np 2"
expect "_rank_wrapper $probe --print"
[[ $(wc -l <<<"$out") == 1 ]] || fail "$case: more than one line"
grep -q "rank 0 of" <<<"$out" && fail "$case: the program ran"

case=exit-code
run "$case" "$bin" run --nproc_per_node 2 "$probe" --exit-on-rank 1 --code 3 --delay 0.5 --sleep 30
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "rank 1"
expect "exit code 3"
expect "colossalai run: rank 1 (host "
expect "all ranks stopped"
expect_faster 15
no_leftovers

case=signal
run "$case" "$bin" run --nproc_per_node 2 "$probe" --signal-on-rank 0 --signal KILL --sleep 30
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "rank 0"
expect "killed by signal 9 (SIGKILL)"
expect_faster 15
no_leftovers

case=timeout
run "$case" "$bin" run --nproc_per_node 2 --timeout 3 "$probe" --sleep-forever-on-rank 1 --sleep 60
expect_rc 124
expect "timeout"
expect "--timeout 3"
expect_faster 15
no_leftovers

# Signals to the launcher: every rank stopped, exit 128 + signal. The probes ignore SIGTERM: the
# wrapper's SIGKILL must still remove them. SIGINT stops the job at once; SIGTERM (preemption) is
# passed to the programs first, and the job is stopped by force after --grace_period (2 s here;
# tests/apps/test_run_preempt.sh has the graceful cases).
for sig in TERM INT; do
  case=sig$sig
  "$bin" run --nproc_per_node 2 --grace_period 2 "$probe" --sleep 60 --ignore-term >"$tmp/out" 2>&1 &
  pid=$!
  sleep 1.5
  t0=$SECONDS
  kill -$sig $pid
  wait $pid
  rc=$?
  out=$(cat "$tmp/out")
  secs=$((SECONDS - t0))
  echo "--- $case: exit $rc in ${secs}s"
  echo "$out" | sed 's/^/    /'
  if [[ $sig == TERM ]]; then
    expect_rc 143
    expect "did not all stop within 2 s (--grace_period): stopping them"
    expect "stopped on request (SIGTERM): 0 of 2 ranks stopped within the grace period; the others were stopped by force after --grace_period 2 s"
  else
    expect_rc 130
    expect "all ranks stopped"
  fi
  expect_faster 15
  no_leftovers
done

# Bad flags: non-zero exit and a message naming the problem.
printf 'nodeA\n# comment\nnodeB\nnodeA  # again\n' >"$tmp/dup.txt"
printf 'nodeA\nnodeB\n' >"$tmp/hosts.txt"
case=include-without-hostfile
run "$case" "$bin" run --nproc_per_node 2 --include nodeA "$probe"
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "[run] --include nodeA works only with --hostfile"
case=include-and-exclude
run "$case" "$bin" run --nproc_per_node 2 --hostfile "$tmp/hosts.txt" --include nodeA \
  --exclude nodeB "$probe"
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "mutually exclusive"
case=unknown-include
run "$case" "$bin" run --nproc_per_node 2 --hostfile "$tmp/hosts.txt" --include nodeZ "$probe"
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "host nodeZ is not in hostfile"
case=duplicate-host
run "$case" "$bin" run --nproc_per_node 2 --hostfile "$tmp/dup.txt" "$probe"
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "host nodeA is listed twice, on lines 1 and 4"
case=missing-hostfile
run "$case" "$bin" run --nproc_per_node 2 --hostfile "$tmp/none.txt" "$probe"
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "$tmp/none.txt not found"
case=no-nproc
run "$case" "$bin" run "$probe"
[[ $rc != 0 ]] || fail "$case: exit code 0"
expect "--nproc_per_node is required"
case=help
run "$case" "$bin" run --help
expect_rc 0
for flag in --nproc_per_node --host --hostfile --include --exclude --num_nodes --master_addr \
  --master_port --ssh-port --extra_launch_args -x --dry-run --timeout PROGRAM; do
  expect "$flag"
done

echo "test_run: $failures failure(s) in $((SECONDS - start_all)) s"
[[ $failures == 0 ]]
