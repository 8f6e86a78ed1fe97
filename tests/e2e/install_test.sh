#!/usr/bin/env bash
# The installed tree as a user links it: `cmake --install` into a temporary prefix, then
# examples/generate.cc built with find_package(nibble) / nibble::nibble and once through
# nibble.pc, run on the embedded model; both print what the installed CLI prints.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR CXX [CXXFLAGS]
set -euo pipefail
build=$1 src=$2 cxx=$3 cxxflags=${4:-}
model=$src/models/prose-llama-7m prompt="Once upon a time"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nibble_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# What the example must print: the CLI's token ids and greedy text for the same prompt.
ids=$("$tmp/prefix/bin/nibble" tokenize --model "$model" --text "$prompt" | tr -d '[] ' | tr ',' ' ')
text=$("$tmp/prefix/bin/nibble" generate --model "$model" --prompt "$prompt" -n 16 --temperature 0 2>/dev/null)
# The installed synth outside the source tree: its default --tokenizer_dir is still found.
(cd "$tmp" && "$tmp/prefix/bin/nibble" synth --config "$model/config.json" --out synth --format dense >/dev/null 2>&1) &&
  [ -f "$tmp/synth/tokenizer.model" ] || { echo "installed synth: no default tokenizer outside the source tree"; exit 1; }
check() {  # $1: what built it, $2: the program
  out=$("$2" "$model" "$prompt")
  [ "$(sed -n 1p <<<"$out")" = "prompt tokens: $ids" ] || { echo "$1: token ids differ: $out / $ids"; exit 1; }
  [ "$(tail -n +2 <<<"$out")" = "$text" ] || { echo "$1: generated text differs: $out / $text"; exit 1; }
  echo "$1: ok"
}
cmake -S "$src/examples" -B "$tmp/example" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$cxxflags" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/example" >/dev/null
check "find_package(nibble)" "$tmp/example/generate"
pc_dir=$(dirname "$(find "$tmp/prefix" -name nibble.pc)")
# shellcheck disable=SC2046,SC2086  # pkg-config's flags are meant to be split
"$cxx" $cxxflags -O1 "$src/examples/generate.cc" -o "$tmp/generate_pc" $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs nibble)
check "pkg-config nibble" "$tmp/generate_pc"
