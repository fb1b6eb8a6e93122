#!/usr/bin/env bash
# docs/bench/README.md is the index of docs/bench: every file under docs/bench (subfolders too)
# must be named there by its path relative to docs/bench (`h100-ab-speed.jsonl`,
# `h100x4-zero-bubble/equivalence.log`); files in a subfolder may instead be matched by a glob in
# backticks that starts with the folder's name (`h100x4-zero-bubble/vitb16-pp*_*.jsonl`; `*` does
# not cross a `/`, and a glob such as `*.jsonl` names nothing). Every relative link of the index
# must lead to a file or folder that exists. A data file added without its entry fails here.
# The checker first runs on a made-up folder where it must report an unlisted file and a broken
# link (so that a checker that passes everything fails the test).
#   test_bench_index.sh DOCS_BENCH_DIR
set -euo pipefail
bench=${1:?path to docs/bench}
check() {  # check DIR: prints one line per problem, exit 1 if any
  python3 - "$1" <<'PY'
import os, re, sys
root = sys.argv[1]
readme = os.path.join(root, "README.md")
text = open(readme, encoding="utf-8").read()
files = sorted(os.path.relpath(os.path.join(d, f), root)
               for d, _, fs in os.walk(root) for f in fs)
files = [f for f in files if f != "README.md"]
def glob_re(g):  # a folder-anchored glob: `*` and `?` stay inside one path component
    return re.compile("".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
                              for c in g) + r"\Z")
globs = [glob_re(g) for g in re.findall(r"`([^`\s]+)`", text)
         if ("*" in g or "?" in g) and "/" in g and not re.search(r"[*?]", g.split("/")[0])]
bad = []
for f in files:
    if f not in text and not any(g.match(f) for g in globs):
        bad.append(f"not named in README.md: {f}")
for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
        continue
    path = os.path.normpath(os.path.join(root, target.split("#")[0]))
    if not os.path.exists(path):
        bad.append(f"README.md links to a missing path: {target}")
print("\n".join(bad))
print(f"{len(files)} files, {len(bad)} problem(s)", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}
# The checker itself: a listed file, an unlisted one, one listed by a folder's glob, one that
# only unanchored globs match, and a broken link.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/sub/deeper"
touch "$tmp/listed.jsonl" "$tmp/unlisted.jsonl" "$tmp/sub/a-1.jsonl" "$tmp/sub/deeper/a-2.jsonl"
printf '# x\n`listed.jsonl`, `sub/a-*.jsonl`, `*.jsonl`, `*/deeper/*`, [gone](gone.md), [ok](listed.jsonl)\n' \
  >"$tmp/README.md"
if out=$(check "$tmp" 2>/dev/null); then
  echo "FAIL: the checker passed a folder with an unlisted file"
  exit 1
fi
grep -qx "not named in README.md: unlisted.jsonl" <<<"$out" &&
  grep -qx "not named in README.md: sub/deeper/a-2.jsonl" <<<"$out" &&
  grep -qx "README.md links to a missing path: gone.md" <<<"$out" &&
  [ "$(wc -l <<<"$out")" -eq 3 ] || {
  echo "FAIL: the checker's report on the made-up folder:"
  echo "$out"
  exit 1
}
# The real index.
if ! out=$(check "$bench"); then
  echo "FAIL: docs/bench/README.md does not index docs/bench:"
  echo "$out"
  exit 1
fi
echo "docs/bench/README.md names every file of docs/bench and its links resolve"
