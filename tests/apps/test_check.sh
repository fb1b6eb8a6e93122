#!/usr/bin/env bash
# colossalai check -i prints its report and exits 0 on a usable machine; --version and --help work.
set -euo pipefail
bin=${1:?path to colossalai}
out=$("$bin" check -i)
echo "$out"
for row in libcai compiler OpenBLAS MPI "CUDA runtime" "CUDA driver" cuBLAS NCCL SimGrid \
  "CUDA architectures" "attention kernels"; do
  grep -q "^  $row " <<<"$out" || { echo "missing row: $row"; exit 1; }
done
grep -q "Usable: yes" <<<"$out"
"$bin" --version | grep -q "^colossalai [0-9]"
"$bin" check --help | grep -q -- "--installation"
if "$bin" check >/dev/null 2>&1; then echo "check without -i should fail"; exit 1; fi
if "$bin" frobnicate >/dev/null 2>&1; then echo "unknown subcommand should fail"; exit 1; fi
echo "check_installation: ok"
