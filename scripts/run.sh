#!/usr/bin/env bash
# The main job on the embedded default model (models/prose-llama-7m): perplexity on held-out prose
# and a short generation. Installs and builds what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target nibble
MODEL=models/prose-llama-7m
TEXT=../shared/data/prose-val.txt
[ -f "$TEXT" ] || TEXT=models/prose-llama-7m/README.md
echo "== perplexity of $MODEL on $TEXT (seq_len 512, first 60 windows)"
./build/release/nibble perplexity --model "$MODEL" --text "$TEXT" --seq_len 512 --max_windows 60
echo "== generate"
./build/release/nibble generate --model "$MODEL" --prompt "And God said unto Moses," -n 48 --temperature 0
