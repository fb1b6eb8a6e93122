#!/usr/bin/env bash
# A rank that never joins a collective: the others fail within CAI_COLLECTIVE_TIMEOUT with a
# message naming the operation and group, the job ends, and no process is left behind.
set -uo pipefail
bin=${1:?mpi_collectives binary}
start=$(date +%s)
out=$(CAI_COLLECTIVE_TIMEOUT=2 timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$bin" --hang 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -v "^\s*$" | head -20
[ $rc -ne 0 ] || { echo "expected a non-zero exit"; exit 1; }
[ $rc -ne 124 ] || { echo "the job hung until the outer timeout"; exit 1; }
grep -q "all_reduce of 16 elements on group 'world' (2 ranks, rank 0) did not complete within 2 s" <<<"$out" ||
  { echo "missing the timeout message"; exit 1; }
[ $elapsed -lt 40 ] || { echo "took ${elapsed}s"; exit 1; }
sleep 1
if pgrep -f "$bin --hang" >/dev/null; then echo "processes left behind"; pkill -9 -f "$bin --hang"; exit 1; fi
echo "hang test: ok (${elapsed}s)"
