#!/usr/bin/env bash
# vit_train's progress output when it goes to a file: under `colossalai run --nproc_per_node 2`
# (Open MPI gives every rank a pty for stdout, whatever the launcher's stdout is) the log must
# hold plain "epoch E/N step ..." lines and no progress-bar escape codes or carriage returns; and
# CAI_STDOUT_TTY=1 (what the launcher sets when its stdout is a terminal) brings the bar back; and
# ranks that disagree on being a terminal take rank 0's choice (the steps that read values).
# Trains a tiny ViT on synthetic data (no files needed).
#   bash tests/apps/test_progress_log.sh build/apps/colossalai build/apps/vit_train CONFIG_DIR
set -uo pipefail
run=${1:?path to colossalai}; bin=${2:?path to vit_train}; configs=${3:?config dir}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset CAI_STDOUT_TTY
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
args=(--config "$configs/fmnist_tiny.toml" --set data.dataset=synthetic
  --set data.synthetic_size=512 --set train.num_epochs=1 --set train.batch_size=32
  --set train.num_workers=1 --set model.depth=1 --set train.log_interval=2)

# Under the launcher, stdout and stderr to a file.
"$run" run --nproc_per_node 2 --timeout 240 "$bin" "${args[@]}" >"$tmp/run.log" 2>&1
rc=$?
[[ $rc == 0 ]] || fail "colossalai run exited $rc"
if grep -q $'\033' "$tmp/run.log"; then fail "escape codes in the log"; fi
if grep -q $'\r' "$tmp/run.log"; then fail "carriage returns in the log"; fi
# 512 samples / (2 ranks × 32) = 8 steps; lines every 2 steps.
for step in 2 4 6 8; do
  grep -q "epoch 1/1 step    $step/8 " "$tmp/run.log" || fail "no plain progress line for step $step"
done
grep -q "epoch 1/1 done: train loss" "$tmp/run.log" || fail "no epoch line"
[[ $(grep -c "epoch 1/1 step" "$tmp/run.log") == 4 ]] || fail "progress lines printed by more than rank 0"

# The launcher's decision reaches the ranks: CAI_STDOUT_TTY=1 gives the bar even into a file.
CAI_STDOUT_TTY=1 "$bin" "${args[@]}" >"$tmp/tty.log" 2>&1 || fail "vit_train with CAI_STDOUT_TTY=1 failed"
grep -q $'\033\[2K' "$tmp/tty.log" || fail "CAI_STDOUT_TTY=1 did not draw the bar"
# And one process into a file (isatty false) prints plain lines.
"$bin" "${args[@]}" >"$tmp/plain.log" 2>&1 || fail "vit_train into a file failed"
if grep -q $'\033' "$tmp/plain.log"; then fail "escape codes from a single process into a file"; fi

# Ranks that disagree on being a terminal (rank 0's stdout one, rank 1's not): every rank must
# still read the step values at the same steps (rank 0's choice), or the values' reduction over
# the ranks matches unlike collectives (an MPI error before the ranks agreed). 100 steps, so the
# bar's interval (steps / 50) and the lines' (steps / 10) differ.
cat >"$tmp/tty_rank0.sh" <<'SH'
#!/usr/bin/env bash
if [[ ${OMPI_COMM_WORLD_RANK:-0} == 0 ]]; then export CAI_STDOUT_TTY=1; else export CAI_STDOUT_TTY=0; fi
exec "$@"
SH
chmod +x "$tmp/tty_rank0.sh"
mixed=(--config "$configs/fmnist_tiny.toml" --set data.dataset=synthetic
  --set data.synthetic_size=6400 --set train.num_epochs=1 --set train.batch_size=32
  --set train.num_workers=1 --set model.depth=1)
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$tmp/tty_rank0.sh" "$bin" \
  "${mixed[@]}" >"$tmp/mixed.log" 2>&1
rc=$?
[[ $rc == 0 ]] || fail "ranks disagreeing on a terminal: exit $rc"
grep -q $'\033\[2K' "$tmp/mixed.log" || fail "ranks disagreeing on a terminal: rank 0 drew no bar"
grep -q "epoch 1/1 done: train loss" "$tmp/mixed.log" || fail "ranks disagreeing on a terminal: no epoch line"

if ((failures)); then
  echo "--- launcher log"; cat "$tmp/run.log"
  echo "$failures failure(s)"
  exit 1
fi
echo "progress output into a log: ok"
