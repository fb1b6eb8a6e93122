#!/usr/bin/env bash
# A rank that stops joining collectives: the others fail within CAI_COLLECTIVE_TIMEOUT with a
# message naming the operation and group, the job ends, and no process is left behind.
#   test_hang.sh MPI_COLLECTIVES_BINARY [mpi|nccl|nccl-ce]   (nccl*: exit 77 when it cannot run
#   here; nccl-ce: the copy-engine all-reduce)
set -uo pipefail
bin=${1:?mpi_collectives binary}
backend=${2:-mpi}
start=$(date +%s)
out=$(CAI_COLLECTIVE_TIMEOUT=2 timeout 90 mpirun --allow-run-as-root --oversubscribe -np 2 "$bin" --hang --backend "$backend" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -v "^\s*$" | head -20
if [ $rc -eq 77 ]; then echo "hang test ($backend): skipped"; exit 77; fi
[ $rc -ne 0 ] || { echo "expected a non-zero exit"; exit 1; }
[ $rc -ne 124 ] || { echo "the job hung until the outer timeout"; exit 1; }
op="[$backend] all_reduce"
[ "$backend" = nccl-ce ] && op="[nccl] copy-engine all_reduce"
grep -qF "$op of 16 elements on group 'world' (2 ranks, rank 0) did not complete within 2 s" <<<"$out" ||
  { echo "missing the timeout message"; exit 1; }
[ $elapsed -lt 60 ] || { echo "took ${elapsed}s"; exit 1; }
sleep 1
if pgrep -f "$bin --hang --backend $backend" >/dev/null; then
  echo "processes left behind"; pkill -9 -f "$bin --hang --backend $backend"; exit 1
fi
echo "hang test ($backend): ok (${elapsed}s)"
