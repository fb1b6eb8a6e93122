#!/usr/bin/env bash
# The run that owns a checkpoint.dir (issue 42): a new run into another run's directory is
# refused and changes nothing (one process and under `colossalai run`), checkpoint.overwrite =
# true replaces that run, --resume continues it and keeps its record, keep_last removes none of
# another run's step directories, and a second live job is refused while the first holds the
# lock (a killed job leaves no stale lock); a run that saved nothing does not hold its directory.
# Each part reports its own failure.
#   test_vit_train_run_identity.sh COLOSSALAI VIT_TRAIN CONFIG_DIR
set -uo pipefail
cai=$1; bin=$2; configs=$3
tmp=$(mktemp -d)
bg=
trap '[ -n "$bg" ] && kill -9 "$bg" 2>/dev/null; rm -rf "$tmp"' EXIT
# One epoch of 4 steps, a checkpoint after each.
common=(--config "$configs/fmnist_tiny.toml" --set data.train_subset=128
  --set data.eval_subset=32 --set train.num_epochs=1 --set train.batch_size=32
  --set train.num_workers=1 --set checkpoint.every_steps=1)
failed=()
fail() { echo "FAIL ($1): $2"; failed+=("$1"); }
train() { local log=$1; shift; "$bin" "${common[@]}" "$@" >"$log" 2>&1; }
# Every file's checksum and every path of a directory.
sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum && find . | sort); }
# A key of a JSON file ("" when the file or key is missing).
key() { python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))
except Exception: print("")' "$1" "$2"; }
expect_in() {  # expect_in PART FILE TEXT...: each TEXT (fixed string) is in FILE
  local part=$1 file=$2; shift 2
  for t in "$@"; do grep -qF -- "$t" "$file" || fail "$part" "the message lacks '$t'"; done
}

# (a) A second run (another seed) into the first run's directory is refused, naming both runs and
# the ways on; not a byte of the first run's files changes. The same under colossalai run.
ck=$tmp/a
train "$tmp/a1.log" --set train.seed=1 --set checkpoint.dir="$ck" --set checkpoint.keep_last=2 ||
  { cat "$tmp/a1.log"; fail a "the first run failed"; }
sums "$ck" >"$tmp/a.before"
train "$tmp/a2.log" --set train.seed=2 --set checkpoint.dir="$ck"
rc=$?
sums "$ck" >"$tmp/a.after"
if [ $rc -eq 0 ]; then
  fail a "a second run (seed 2) into the directory of the first (seed 1) exited 0"
else
  cat "$tmp/a2.log"
  expect_in a "$tmp/a2.log" "belongs to another run" "$(key "$ck/run.json" run_id)" "seed 1," \
    "config hash $(key "$ck/run.json" config_hash)" "started $(key "$ck/run.json" started)" \
    "seed 2," "--resume" "another checkpoint.dir" "checkpoint.overwrite = true"
  [ "$(grep -o "config hash [0-9a-f]*" "$tmp/a2.log" | sort -u | wc -l)" = 2 ] ||
    fail a "the message does not give both config hashes"
fi
diff "$tmp/a.before" "$tmp/a.after" || fail a "the first run's files changed"
"$cai" run --nproc_per_node 2 "$bin" "${common[@]}" --set train.seed=3 \
  --set checkpoint.dir="$ck" >"$tmp/a3.log" 2>&1
rc=$?
sums "$ck" >"$tmp/a.after2"
[ $rc -ne 0 ] || fail a "a 2-process run into the first run's directory exited 0"
expect_in a "$tmp/a3.log" "belongs to another run" "seed 1," "seed 3,"
diff "$tmp/a.before" "$tmp/a.after2" || fail a "the 2-process run changed the first run's files"

# (b) checkpoint.overwrite = true: the first run's step directories go, this run's record and
# checkpoints take their place.
first=$(key "$ck/run.json" run_id)
if train "$tmp/b.log" --set train.seed=2 --set checkpoint.dir="$ck" --set checkpoint.overwrite=true
then
  new=$(key "$ck/run.json" run_id)
  [ -n "$new" ] && [ "$new" != "$first" ] && [ "$(key "$ck/run.json" seed)" = 2 ] ||
    fail b "run.json is not the new run's: $(cat "$ck/run.json" 2>&1)"
  for s in 1 2 3 4; do
    [ "$(key "$ck/step-00000000$s/trainer_state.json" run_id)" = "$new" ] ||
      fail b "step-00000000$s is not the new run's"
  done
  [ "$(cat "$ck/latest")" = step-000000004 ] || fail b "latest is $(cat "$ck/latest")"
else
  cat "$tmp/b.log"; fail b "the run with checkpoint.overwrite = true failed"
fi

# (c) --resume continues the directory's run and keeps its record (adding the resume).
ck=$tmp/c
train "$tmp/c1.log" --set train.seed=1 --set checkpoint.dir="$ck" ||
  { cat "$tmp/c1.log"; fail c "the first run failed"; }
id=$(key "$ck/run.json" run_id); started=$(key "$ck/run.json" started)
if train "$tmp/c2.log" --set train.seed=1 --set checkpoint.dir="$ck" \
    --resume "$ck/step-000000002"; then
  grep -q "resuming .*step-000000002" "$tmp/c2.log" || fail c "it did not resume step 2"
  [ -n "$id" ] && [ "$(key "$ck/run.json" run_id)" = "$id" ] &&
    [ "$(key "$ck/run.json" started)" = "$started" ] || fail c "the record changed: $(cat "$ck/run.json" 2>&1)"
  python3 - "$ck/run.json" <<'PY' || fail c "the resume is not recorded"
import json, sys
r = json.load(open(sys.argv[1]))["resumed"]
assert len(r) == 1 and r[0]["checkpoint"].endswith("/step-000000002"), r
PY
  [ "$(key "$ck/step-000000004/trainer_state.json" run_id)" = "$id" ] ||
    fail c "step 4 saved by the resumed run does not name the run"
else
  cat "$tmp/c2.log"; fail c "--resume of the directory's run failed"
fi
# --resume alone (checkpoint.dir's latest, the finished run): nothing left to do, exit 0.
train "$tmp/c3.log" --set train.seed=1 --set checkpoint.dir="$ck" --resume ||
  { cat "$tmp/c3.log"; fail c "--resume of the finished run failed"; }

# (d) keep_last removes the run's own older checkpoints, never another run's: step 1 of another
# run and step 2 written before run records (both made by hand) stay.
ck=$tmp/d
train "$tmp/d1.log" --set train.seed=1 --set checkpoint.dir="$ck" --set checkpoint.keep_last=2 ||
  { cat "$tmp/d1.log"; fail d "the first run failed"; }
cp -r "$ck/step-000000003" "$ck/step-000000001"
cp -r "$ck/step-000000003" "$ck/step-000000002"
python3 - "$ck" <<'PY'
import json, sys
for step, run in (("step-000000001", "20250101T000000Z-another-run"), ("step-000000002", None)):
    p = f"{sys.argv[1]}/{step}/trainer_state.json"
    j = json.load(open(p))
    j.pop("run_id", None)
    if run:
        j["run_id"] = run
    json.dump(j, open(p, "w"))
PY
sums "$ck/step-000000001" >"$tmp/d.foreign1"
sums "$ck/step-000000002" >"$tmp/d.foreign2"
if train "$tmp/d2.log" --set train.seed=1 --set checkpoint.dir="$ck" --set checkpoint.keep_last=1 \
    --resume "$ck/step-000000003"; then
  [ ! -e "$ck/step-000000003" ] && [ -d "$ck/step-000000004" ] ||
    fail d "keep_last 1 did not keep only the run's step 4: $(ls "$ck")"
  for s in 1 2; do
    if [ -d "$ck/step-00000000$s" ]; then
      sums "$ck/step-00000000$s" | diff "$tmp/d.foreign$s" - >/dev/null ||
        fail d "step-00000000$s (not the run's) changed"
    else
      fail d "keep_last deleted step-00000000$s, which is not the run's"
    fi
  done
else
  cat "$tmp/d2.log"; fail d "the resumed run failed"
fi

# (e) While a job runs, a second one on its directory (a resume or a new run) is refused naming
# the first's pid and host; once the first is killed (SIGKILL), its lock is gone.
ck=$tmp/e
"$bin" "${common[@]}" --set train.num_epochs=100000 --set checkpoint.every_steps=2 \
  --set checkpoint.keep_last=1 --set checkpoint.dir="$ck" >"$tmp/e1.log" 2>&1 &
bg=$!
for _ in $(seq 240); do
  [ -f "$ck/latest" ] && break
  kill -0 "$bg" 2>/dev/null || break
  sleep 0.5
done
if [ -f "$ck/latest" ] && kill -0 "$bg" 2>/dev/null; then
  for how in resume new; do
    args=(--resume); [ $how = new ] && args=(--set train.seed=7)
    train "$tmp/e_$how.log" --set checkpoint.dir="$ck" "${args[@]}"
    rc=$?
    if [ $rc -eq 0 ]; then
      fail e "a second job ($how) on the directory of a running job exited 0"
    else
      cat "$tmp/e_$how.log"
      expect_in e "$tmp/e_$how.log" "in use by another job" "pid $bg on host $(uname -n)"
    fi
  done
  kill -9 "$bg"; wait "$bg" 2>/dev/null; bg=
  train "$tmp/e_after.log" --set checkpoint.dir="$ck" --resume ||
    { cat "$tmp/e_after.log"; fail e "--resume after the first job was killed failed"; }
  grep -q "resuming " "$tmp/e_after.log" || fail e "it did not resume"
else
  cat "$tmp/e1.log"; fail e "the first job saved no checkpoint"
fi

# (f) A run that ended before its first checkpoint (here: no such dataset) leaves only its
# record: the same command, corrected, runs.
ck=$tmp/f
train "$tmp/f1.log" --set checkpoint.dir="$ck" --set data.path="$tmp/no-such-dataset" &&
  fail f "a run without its dataset exited 0"
[ -f "$ck/run.json" ] || fail f "the failed run left no record"
train "$tmp/f2.log" --set checkpoint.dir="$ck" ||
  { cat "$tmp/f2.log"; fail f "the run after a run that saved nothing was refused"; }
grep -q "replacing the record of run" "$tmp/f2.log" || fail f "the replaced record is not logged"

if [ ${#failed[@]} -gt 0 ]; then
  echo "vit_train run identity: failed: ${failed[*]}"
  exit 1
fi
echo "vit_train run identity: ok"
