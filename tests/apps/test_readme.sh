#!/usr/bin/env bash
# Runs the README's shell commands as written. Every ```bash block runs, in order, from a scratch
# folder that mirrors the checkout (its top-level entries linked, `build` the build under test),
# unless the line before it says
#   <!-- ci: skip: REASON -->          (GPU, multi-host, package installs, your own data), or
#   <!-- ci: needs PATH|COMMAND ... --> (run only where each exists, e.g. the GUI build).
# A block fails the test when any of its commands exits non-zero (bash -e -o pipefail).
# Usage: test_readme.sh SOURCE_DIR BUILD_DIR [MIN_RUN_BLOCKS]
set -uo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
min_run=${3:-6}
readme=$src/README.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for e in "$src"/* "$src"/.[!.]*; do
  [ -e "$e" ] || continue
  name=$(basename "$e")
  case $name in build | .git) continue ;; esac
  ln -s "$e" "$work/$name"
done
ln -s "$build" "$work/build"

# Every relative link and image of the README names a file or folder of the checkout.
bad_links=0
while IFS= read -r link; do
  target=${link%%#*}
  [ -n "$target" ] || continue
  if [ ! -e "$src/$target" ]; then
    echo "FAIL: README links to $target, which does not exist"
    bad_links=$((bad_links + 1))
  fi
done < <(grep -o '](\([^)]*\))' "$readme" | sed 's/^](//; s/)$//' | grep -v '^[a-z]*://')
[ "$bad_links" -eq 0 ] || exit 1

# Split the README into blocks: blocks/N.sh and blocks/N.tag (the marker before it, or "run").
mkdir -p "$work/.blocks"
awk -v dir="$work/.blocks" '
  /^```bash[ \t]*$/ { n++; inb = 1; f = dir "/" n ".sh"; printf "" > f
                      t = (prev ~ /^<!-- ci: /) ? prev : "run"; print t > (dir "/" n ".tag"); next }
  inb && /^```[ \t]*$/ { inb = 0; close(f); next }
  inb { print >> f; next }
  NF { prev = $0 }
' "$readme"

total=$(ls "$work/.blocks"/*.sh 2>/dev/null | wc -l)
ran=0
skipped=0
failed=0
for i in $(seq 1 "$total"); do
  tag=$(cat "$work/.blocks/$i.tag")
  block="$work/.blocks/$i.sh"
  first=$(grep -m1 . "$block")
  if [[ $tag == "<!-- ci: skip:"* ]]; then
    reason=${tag#<!-- ci: skip: }
    echo "== block $i skipped (${reason% -->}): $first"
    skipped=$((skipped + 1))
    continue
  fi
  if [[ $tag == "<!-- ci: needs "* ]]; then
    needs=${tag#<!-- ci: needs }
    needs=${needs% -->}
    missing=""
    for n in $needs; do
      [ -e "$work/$n" ] || command -v "$n" >/dev/null 2>&1 || missing="$missing $n"
    done
    if [ -n "$missing" ]; then
      echo "== block $i not run here (missing:$missing): $first"
      skipped=$((skipped + 1))
      continue
    fi
  elif [[ $tag != "run" ]]; then
    echo "FAIL: block $i has an unknown marker: $tag (expected '<!-- ci: skip: REASON -->' or '<!-- ci: needs ... -->')"
    exit 1
  fi
  echo "== block $i:"
  sed 's/^/   /' "$block"
  start=$(date +%s)
  if (cd "$work" && bash -e -o pipefail "$block") >"$work/.blocks/$i.log" 2>&1; then
    echo "   ok in $(($(date +%s) - start)) s; last lines:"
    tail -n 3 "$work/.blocks/$i.log" | cut -c1-160 | sed 's/^/   | /'
    ran=$((ran + 1))
  else
    rc=$?
    echo "FAIL: block $i exited $rc after $(($(date +%s) - start)) s; its output:"
    tail -n 40 "$work/.blocks/$i.log"
    failed=$((failed + 1))
  fi
done
echo "README: $total bash blocks, $ran ran, $skipped skipped or not run here, $failed failed"
[ "$failed" -eq 0 ] || exit 1
if [ "$ran" -lt "$min_run" ]; then
  echo "FAIL: only $ran blocks ran (expected at least $min_run): markers or the parser are wrong"
  exit 1
fi
