#!/usr/bin/env bash
# docs/CONFIG.md is vit_train --help-config's output, byte for byte: a key added to the config's
# table (or a default changed) without regenerating the page fails here.
# Usage: test_config_doc.sh VIT_TRAIN DOCS_CONFIG_MD
set -euo pipefail
vit_train=$1
doc=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$vit_train" --help-config >"$out"
grep -q '^| `batch_size` | integer | `128` |' "$out" || {
  echo "FAIL: --help-config printed no batch_size row"
  exit 1
}
if ! diff -u "$doc" "$out"; then
  echo "FAIL: $doc differs from vit_train --help-config; regenerate it:"
  echo "  build/apps/vit_train --help-config > docs/CONFIG.md"
  exit 1
fi
echo "docs/CONFIG.md matches vit_train --help-config ($(grep -c '^| `' "$out") keys)"
