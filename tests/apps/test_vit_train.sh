#!/usr/bin/env bash
# vit_train as a user meets it: --help, --dry-run, config errors with exit code 2.
set -euo pipefail
bin=${1:?path to vit_train}; configs=${2:?config dir}
"$bin" --help | grep -q -- "--dry-run"
out=$("$bin" --config "$configs/fmnist_tiny.toml" --dry-run)
grep -q "^\[train\]" <<<"$out"
grep -q "parameters" <<<"$out"
grep -q "memory per process" <<<"$out"
set +e
err=$("$bin" --config "$configs/fmnist_tiny.toml" --set train.batchsize=3 2>&1); rc=$?
set -e
[ $rc -eq 2 ] || { echo "expected exit 2 for an unknown key, got $rc"; exit 1; }
grep -q "unknown key 'train.batchsize'" <<<"$err"
set +e
err=$(DATA=/tmp "$bin" --config "$configs/vit_base_cifar10_hybrid.toml" 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "1 processes are not divisible by tensor size 2 × pipeline 2" <<<"$err" ||
  { echo "hybrid config on one process: $err"; exit 1; }
set +e
err=$(DATA=/tmp "$bin" --config "$configs/vit_base_cifar10_hybrid.toml" --set parallel.tensor.mode=2d 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "valid sizes are 4, 9" <<<"$err" || { echo "2d tensor mode: $err"; exit 1; }
set +e
err=$(DATA=/tmp "$bin" --config "$configs/vit_base_cifar10_pp.toml" 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "1 processes are not divisible" <<<"$err" ||
  { echo "pipeline config on one process: $err"; exit 1; }
# Dry runs for N processes: the pipeline config per stage, the hybrid one on 4 processes.
out=$(DATA=/tmp "$bin" --config "$configs/vit_base_cifar10_pp.toml" --dry-run --nproc 2)
grep -q "stage 0" <<<"$out" && grep -q "stage 1" <<<"$out" || { echo "pp dry run: $out"; exit 1; }
out=$(DATA=/tmp "$bin" --config "$configs/vit_base_cifar10_hybrid.toml" --dry-run --nproc 4)
grep -q "dp 1 × pp 2 × tp 2" <<<"$out" || { echo "hybrid dry run: $out"; exit 1; }
set +e
err=$(DATA=/tmp "$bin" --config "$configs/vit_base_cifar10_pp.toml" --dry-run --nproc 3 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "3 processes are not divisible" <<<"$err" ||
  { echo "pp dry run on 3: $err"; exit 1; }
# --trace records through the pipeline executor, which runs ZeRO 0/1 only: a ZeRO-3 run asking for
# a trace is refused up front, naming --trace (not the executor's pipeline message).
set +e
err=$("$bin" --config "$configs/fmnist_tiny.toml" --set parallel.zero_stage=3 \
  --set data.dataset=synthetic --trace "$(mktemp -u).json" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q -- "--trace .* with parallel.zero_stage = 3" <<<"$err" ||
  { echo "--trace with ZeRO 3: rc $rc: $err"; exit 1; }
# The metrics file's run record counts gradient accumulation in the global batch.
metrics=$(mktemp)
"$bin" --config "$configs/fmnist_tiny.toml" --set data.dataset=synthetic \
  --set train.gradient_accumulation=2 --set train.max_steps_per_epoch=1 --set train.num_epochs=1 \
  --set "train.metrics_file=$metrics" >/dev/null 2>&1
python3 - "$metrics" <<'PY'
import json, sys
run = json.loads(open(sys.argv[1]).readline())
assert run["type"] == "run" and run["gradient_accumulation"] == 2, run
assert run["global_batch"] == run["batch_per_process"] * 2 * run["dp"], run
PY
rm -f "$metrics"
echo "vit_train cli: ok"
