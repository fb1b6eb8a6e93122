#!/usr/bin/env bash
# colossalai-gui headless as a user meets it: screenshots, errors on stderr naming the file,
# the explorer still writing its picture.
set -euo pipefail
bin=${1:?path to colossalai-gui}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" --help | grep -q -- "--screenshot"
"$bin" --screenshot "$dir/a.png" --pp 4 --schedule 1f1b --microbatches 8 >/dev/null
[ "$(stat -c %s "$dir/a.png")" -gt 20000 ] || { echo "a.png is too small"; exit 1; }
head -c 8 "$dir/a.png" | od -An -c | grep -q "P   N   G" || { echo "a.png is not a PNG"; exit 1; }
printf '{"traceEvents": [' >"$dir/bad.json"
printf '{"type":"step","epoch":1,"step":1,"loss":2.3,"accuracy":0.1,"lr":0.001,"img_per_s":100}\n{"type":"step","epoch":1,"step":2,"loss":2.0,"accuracy":0.2,"lr":0.001,"img_per_s":110}\n' >"$dir/m.jsonl"
err=$("$bin" --screenshot "$dir/b.png" --trace "$dir/bad.json" --metrics "$dir/m.jsonl" \
  --layout curves 2>&1 >/dev/null)
grep -q "\[gui\] trace $dir/bad.json: not JSON" <<<"$err" || { echo "stderr: $err"; exit 1; }
[ -s "$dir/b.png" ] || { echo "no screenshot after a bad trace"; exit 1; }
err=$("$bin" --screenshot "$dir/c.png" --pp 4 --schedule interleaved --microbatches 6 2>&1 >/dev/null)
grep -q "multiple of the stage count (4)" <<<"$err" || { echo "stderr: $err"; exit 1; }
# A malformed cluster file: the simulator's error naming the file (or, without SimGrid, that
# there is no simulator); the picture is still written.
printf 'name = "x"\nnodes = "many"\n' >"$dir/bad.toml"
err=$("$bin" --screenshot "$dir/e.png" --source simulator --cluster "$dir/bad.toml" 2>&1 >/dev/null)
grep -q "\[cluster\] $dir/bad.toml\|built without SimGrid" <<<"$err" || { echo "stderr: $err"; exit 1; }
[ -s "$dir/e.png" ] || { echo "no screenshot after a bad cluster file"; exit 1; }
# A/B from the command line: A is pinned, B differs.
out=$("$bin" --screenshot "$dir/f.png" --pp 4 --microbatches 8 --ab parallel.pp_style=gpipe 2>&1)
grep -q "B: step .* B - A: step" <<<"$out" || { echo "--ab: $out"; exit 1; }
if "$bin" --screenshot "$dir/d.png" --schedule zigzag >/dev/null 2>&1; then
  echo "an unknown schedule was accepted"; exit 1
fi
echo "colossalai-gui cli: ok"
