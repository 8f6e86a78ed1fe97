#!/usr/bin/env bash
# The main job on the embedded default model (models/prose-llama-7m): quantize it to AMD Quark
# hf_format uint4 g128 (RTN), compare FP and int4 perplexity side by side, then generate from the
# int4 model. Installs and builds what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
# The Python binding too when CMake builds it (docs/PYTHON.md): PYTHONPATH=build/release/python.
targets=(nibble)
if grep -q '^NIBBLE_PYTHON:BOOL=ON$' build/release/CMakeCache.txt; then targets+=(nibble_python); fi
cmake --build --preset release -j "$(nproc)" --target "${targets[@]}"
NIBBLE=./build/release/nibble
MODEL=models/prose-llama-7m
OUT=build/prose-llama-7m-quark-w4-g128
TEXT=../shared/data/prose-val.txt
[ -f "$TEXT" ] || TEXT=models/prose-llama-7m/README.md  # fallback when ../shared is absent
WINDOWS=60

echo "== quantize $MODEL -> $OUT (Quark hf_format, w_uint4_per_group_asym, g128, RTN)"
$NIBBLE quantize --model_dir "$MODEL" --output_dir "$OUT" --quant_scheme w_uint4_per_group_asym \
  --group_size 128 --quant_algo rtn --model_export hf_format --overwrite

ppl() { "$NIBBLE" perplexity --model "$1" --text "$TEXT" --seq_len 512 --max_windows "$WINDOWS" 2>/dev/null; }
echo "== perplexity on $TEXT (seq_len 512, first $WINDOWS windows)"
fp=$(ppl "$MODEL"); q=$(ppl "$OUT")
echo "$fp" | grep -E '^(protocol|tokens)'
fp_ppl=$(echo "$fp" | sed -n 's/^perplexity: //p'); q_ppl=$(echo "$q" | sed -n 's/^perplexity: //p')
printf '%-34s %10s\n' "model" "perplexity" "FP (bf16 weights, fp32 compute)" "$fp_ppl" "Quark uint4 g128 RTN (bf16 acts)" "$q_ppl"
awk -v a="$fp_ppl" -v b="$q_ppl" 'BEGIN { printf "int4 / FP: %+.3f %%\n", (b / a - 1) * 100 }'

echo "== generate from the int4 model (greedy)"
$NIBBLE generate --model "$OUT" --prompt "And God said unto Moses," -n 48 --temperature 0
