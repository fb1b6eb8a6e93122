#!/usr/bin/env bash
# colossalai benchmark --search (through colossalai-sim): the config's [parallel] layout is the
# starting point, not a constraint. A config whose layout needs 16 processes (vit_6b_imagenet:
# tp 1d 4 × pp 4; fmnist_tiny with the same overrides) is searched on 4: every ranked layout uses
# 4 processes and keeps the global batch, the output names the config's layout, and --out writes
# the whole config with the pick's layout that vit_train --dry-run takes on 4 processes and
# `colossalai run --nproc_per_node 4 vit_train` runs as written. A layout that does not divide
# (pipeline 3 on 4) is ranked too (--json, exhaustive: every entry's config runs). Nothing that
# fits: the error names the config's layout, the memory the smallest layout needed and the most
# frequent refusals; more processes than the cluster has: said before searching.
#   test_benchmark_search.sh COLOSSALAI VIT_TRAIN CONFIG_DIR CLUSTER_DIR
set -euo pipefail
bin=$1 vit_train=$2 configs=$3 clusters=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export DATA=$tmp/data  # vit_6b_imagenet's data.path is "${DATA}/imagenet/train"

# check_plan CONFIG N: vit_train --dry-run takes CONFIG on N processes and its plan line is a
# layout of exactly N (dp × pp × tp = N).
check_plan() {
  local dry line d p t
  dry=$("$vit_train" --config "$1" --dry-run --nproc "$2")
  line=$(grep -E "^# plan: $2 processes = dp [0-9]+ × pp [0-9]+ × tp [0-9]+" <<<"$dry") ||
    { echo "no plan line of $2 processes for $1"; grep "plan:" <<<"$dry"; exit 1; }
  read -r d p t < <(sed -E 's/.*= dp ([0-9]+) × pp ([0-9]+) × tp ([0-9]+).*/\1 \2 \3/' <<<"$line")
  [ $((d * p * t)) -eq "$2" ] || { echo "$line: dp × pp × tp is not $2"; exit 1; }
  echo "$line"
}

# (a) The issue's command: vit_6b_imagenet (tp 1d 4 × pp 4 × dp 4 on 64 GPUs) on 4 H200.
big=(-m vit --config "$configs/vit_6b_imagenet.toml")
"$bin" benchmark --search -g 4 "${big[@]}" --cluster "$clusters/h200-4.toml" \
  --json "$tmp/big.json" --out "$tmp/big.toml" >"$tmp/big.txt"
cat "$tmp/big.txt"
grep -qF "config layout: pp 4 × tp 1d 4, zero 1, 1f1b m 8, checkpointing (16 processes a replica, which does not divide 4), the starting point: every layout of 4 processes searched; global batch 64 kept" \
  "$tmp/big.txt" || { echo "no line naming the config's layout"; exit 1; }
python3 - "$tmp/big.json" "$tmp/big.toml" "$configs/vit_6b_imagenet.toml" <<'PY'
import json, sys, tomllib
d = json.load(open(sys.argv[1]))
r = d["ranked"]
assert d["nproc"] == 4 and d["global_batch"] == 64 and d["base_processes"] == 16, d
assert d["base_layout"] == "pp 4 × tp 1d 4, zero 1, 1f1b m 8, checkpointing", d["base_layout"]
assert len(r) >= 2, f"{len(r)} layouts ranked"
for x in r:
    c = tomllib.loads(x["toml"])
    tp, pp = c["parallel"]["tensor"]["size"], c["parallel"]["pipeline"]
    assert tp * pp <= 4 and 4 % (tp * pp) == 0, (x["layout"], tp, pp)
    # The global batch kept: per-dp batch × accumulation (tried without a pipeline) × dp.
    acc = c["train"]["gradient_accumulation"]
    assert c["train"]["batch_size"] * acc * (4 // (tp * pp)) == 64, (x["layout"], c["train"])
    assert acc == 1 or pp == 1, (x["layout"], acc)
    assert x["layout"].startswith(f"dp {4 // (tp * pp)} × pp {pp} × tp "), x["layout"]
# --out: the original config with the pick's layout keys replaced, every other key kept.
text = open(sys.argv[2]).read()
assert r[0]["layout"] in text.splitlines()[1], text.splitlines()[:2]
assert "# Run: colossalai run --nproc_per_node 4 vit_train --config" in text
assert "was the starting point" in text and "pp 4 × tp 1d 4" in text
out, orig = tomllib.loads(text), tomllib.load(open(sys.argv[3], "rb"))
assert tomllib.loads(r[0]["toml"]) == out, "--out is not the best ranked config"
def flat(t, p=""):
    for k, v in t.items():
        if isinstance(v, dict):
            yield from flat(v, f"{p}{k}.")
        else:
            yield f"{p}{k}", v
picked = ("model.checkpoint", "train.batch_size", "train.gradient_accumulation")
o = dict(flat(out))
for k, v in flat(orig):
    if k.startswith("parallel.") or k in picked:
        continue
    assert k in o and o[k] == v, (k, v, o.get(k))
assert o["data.path"] == "${DATA}/imagenet/train", o["data.path"]  # written unexpanded
print(f"search of vit_6b on 4: {len(r)} layouts of 4 processes ranked, --out keeps the config: ok")
PY
check_plan "$tmp/big.toml" 4

# (b) A small model with the same 16-process layout: --out runs as written on 4 CPU processes
# (two steps, the run's settings given to the search with --set and so written in the file).
small=(-m vit --config "$configs/fmnist_tiny.toml" --set parallel.tensor.mode=1d
  --set parallel.tensor.size=4 --set parallel.pipeline=4 --set parallel.num_microbatches=8
  --set train.num_epochs=1 --set train.max_steps_per_epoch=2 --set data.eval_subset=256)
"$bin" benchmark --search -g 4 "${small[@]}" --cluster "$clusters/cpu-2.toml" \
  --out "$tmp/small.toml" >"$tmp/small.txt"
grep -qF "config layout: pp 4 × tp 1d 4, zero 0, 1f1b m 8 (16 processes a replica, which does not divide 4)" \
  "$tmp/small.txt" || { echo "no line naming the small config's layout"; exit 1; }
[ "$(grep -cE '^ +[0-9]+  dp [0-9]+ × ' "$tmp/small.txt")" -ge 2 ] ||
  { echo "fewer than 2 layouts ranked"; exit 1; }
check_plan "$tmp/small.toml" 4
"$bin" run --nproc_per_node 4 "$vit_train" --config "$tmp/small.toml" \
  >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; echo "the --out config did not run"; exit 1; }
grep -q "2 steps of global batch 128 per epoch, 1 epochs, 4 process(es)" "$tmp/run.log" ||
  { cat "$tmp/run.log"; echo "not the global batch of 128 on 4 processes"; exit 1; }
grep -q "finished: test accuracy" "$tmp/run.log" || { cat "$tmp/run.log"; exit 1; }
echo "--out of fmnist_tiny (tp 4 × pp 4) ran on 4 processes: ok"

# The config's own layout when it fits 4 (data parallel 4): the global batch is its 4 × 128.
"$bin" benchmark --gpus 4 --search --config "$configs/fmnist_tiny.toml" \
  --cluster "$clusters/cpu-2.toml" --out "$tmp/best.toml" >"$tmp/search.txt"
grep -qF "config layout: dp 4 × pp 1 × tp 1, zero 0 (1 process a replica), the starting point: every layout of 4 processes searched; global batch 512 kept (train.batch_size 128 × dp 4" \
  "$tmp/search.txt" || { cat "$tmp/search.txt"; echo "no config layout line"; exit 1; }
check_plan "$tmp/best.toml" 4
# Pipeline 3 does not divide 4 processes either. --json: every simulated layout (exhaustive),
# best first, each with a config that vit_train runs as written.
"$bin" benchmark --gpus 4 --search --config "$configs/fmnist_tiny.toml" \
  --set parallel.pipeline=3 --cluster "$clusters/cpu-2.toml" --json "$tmp/search.json" \
  >"$tmp/search3.txt"
grep -q "layouts considered" "$tmp/search3.txt"
python3 - "$tmp/search.json" "$tmp" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["ranked"]
assert d["nproc"] == 4 and len(r) == d["simulated"] and d["bounded"] == 0 and len(r) > 10, d
assert [x["rank"] for x in r] == list(range(1, len(r) + 1))
assert all(a["img_per_s"] >= b["img_per_s"] for a, b in zip(r, r[1:])), "not best first"
assert all("[parallel]" in x["toml"] and x["step_ms"] > 0 for x in r)
open(f"{sys.argv[2]}/last.toml", "w").write(r[-1]["toml"])
PY
check_plan "$tmp/last.toml" 4

# (c) Nothing fits: ViT-6B on 3 processes of cpu-2 (11 GiB each). The error names the config's
# layout, the smallest layout's memory and why the others were refused.
set +e
err=$("$bin" benchmark --search -g 3 "${big[@]}" --cluster "$clusters/cpu-2.toml" 2>&1)
rc=$?
set -e
echo "$err"
[ $rc -ne 0 ] || { echo "-g 3 of ViT-6B on cpu-2 did not fail"; exit 1; }
for s in "no layout of 3 processes fits (the config's layout: pp 4 × tp 1d 4" \
  "above the 11.0 GiB" "(the smallest, dp 1 × pp 3 × tp 1," \
  "num_heads 64 is not divisible by the tensor-parallel size 3" \
  "the global batch 64 does not split into 3 equal data-parallel parts"; do
  grep -qF "$s" <<<"$err" || { echo "the error does not say: $s"; exit 1; }
done
set +e
err=$("$bin" benchmark --search -g 8 "${big[@]}" --cluster "$clusters/cpu-2.toml" 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] && grep -qF "8 processes do not fit cluster cpu-2: it has 2 GPUs × 2 rank(s) each = 4" \
  <<<"$err" || { echo "-g 8 on cpu-2: $err"; exit 1; }
echo "colossalai benchmark --search: ok"
