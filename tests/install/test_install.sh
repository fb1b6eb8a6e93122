#!/usr/bin/env bash
# libcai as an installed package: `cmake --install` the build into a temporary prefix, check the
# installed headers include only installed headers and the CMake files name no build or source
# path, then configure and build examples/find_package against the prefix (find_package(cai),
# cai::cai) and run it: one CPU training step of a tiny ViT must print a finite loss and exit 0.
#   bash tests/install/test_install.sh CMAKE BUILD_DIR SOURCE_DIR
set -euo pipefail
cmake=${1:?path to cmake}
build=$(cd "${2:?build directory}" && pwd)
src=$(cd "${3:?source directory}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; exit 1; }
config=$(find "$prefix" -name caiConfig.cmake)
[[ -n $config ]] || { echo "no caiConfig.cmake under $prefix"; exit 1; }
ls "$prefix"/lib*/libcai.a "$prefix"/lib*/libcai_kernels.a "$prefix/include/cai/config/config.h" \
  >/dev/null

# Every quoted include of an installed header is installed too.
missing=0
while IFS= read -r h; do
  while IFS= read -r inc; do
    [[ -f $prefix/include/$inc || -f $(dirname "$h")/$inc ]] ||
      { echo "${h#"$prefix"/}: includes \"$inc\", which is not installed"; missing=1; }
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$h")
done < <(find "$prefix/include" -name '*.h')
[[ $missing == 0 ]] || exit 1
if grep -rlF -e "$build" -e "$src" "$(dirname "$config")"; then
  echo "the installed CMake files above name the build or source tree"
  exit 1
fi

"$cmake" -S "$src/examples/find_package" -B "$tmp/example" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
"$cmake" --build "$tmp/example" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
out=$("$tmp/example/vit_step")
echo "$out"
loss=$(sed -n 's/^loss \([^ ]*\)$/\1/p' <<<"$out")
[[ -n $loss ]] || { echo "no 'loss X' line"; exit 1; }
awk -v l="$loss" 'BEGIN { exit !(l == l + 0 && l > 0 && l < 1e30) }' ||
  { echo "loss $loss is not a finite positive number"; exit 1; }
echo "install: ok"
