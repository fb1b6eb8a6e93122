#!/usr/bin/env bash
# Multi-node for real: two hosts made of network namespaces with their own sshd
# (scripts/multinode-test), `colossalai run --hostfile` across them with 2 ranks each, training
# the Fashion-MNIST job; its per-step losses must match one process with the same global batch
# (≤ 1e-5 relative). Exit 77 (skipped, with the reason printed) where namespaces are unavailable.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?build dir}
build=$(cd "$build" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$root/apps/vit_train/configs/fmnist_tiny.toml" --set train.num_epochs=1
  --set train.max_steps_per_epoch=20 --set data.eval_subset=1000 --set train.num_workers=1)
CAI_BUILD=$build timeout 600 bash "$root/scripts/multinode-test" "$build/apps/vit_train" \
  "${common[@]}" --set train.batch_size=32 --set "train.metrics_file=$work/multi.jsonl"
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "multinode run failed with $rc"; exit 1; }
"$build/apps/vit_train" "${common[@]}" --set train.batch_size=128 \
  --set "train.metrics_file=$work/single.jsonl" >/dev/null || { echo "single run failed"; exit 1; }
python3 - "$work/single.jsonl" "$work/multi.jsonl" <<'PY'
import json, sys
load = lambda p: [json.loads(l) for l in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
sa = [x["loss"] for x in a if x["type"] == "step"]
sb = [x["loss"] for x in b if x["type"] == "step"]
assert len(sa) == len(sb) and sa, (len(sa), len(sb))
worst = max(abs(x - y) / abs(x) for x, y in zip(sa, sb))
ea = [x for x in a if x["type"] == "epoch"][-1]
eb = [x for x in b if x["type"] == "epoch"][-1]
print(f"steps compared: {len(sa)}, worst loss rel diff {worst:.2e}; "
      f"test accuracy single {ea['test_accuracy']:.4f} multinode {eb['test_accuracy']:.4f}")
sys.exit(0 if worst <= 1e-5 and abs(ea["train_loss"] - eb["train_loss"]) <= 1e-5 * ea["train_loss"] else 1)
PY
