#!/usr/bin/env bash
# Llama-2-7B-scale measurements, one function per section:
#   bash bench/scale.sh calib   AWQ and GPTQ with bf16 and fp32 calibration (--calib_dtype) on
#                               LAYERS (default 2) decoder layers of the Llama-2-7B shape (random
#                               weights, `nibble synth --format dense`), 32 x 512 calibration
#                               tokens, and one fp forward over the same tokens (`nibble
#                               perplexity`, 32 windows of 512); per-layer seconds (the --report's
#                               calib_layers) extrapolated to 32 layers.
# Environment: NIBBLE (binary, default build/release/nibble), SCALE_DIR (work directory for the
# synthetic checkpoint, default /tmp/nibble-scale; removed at the end unless KEEP=1), THREADS
# (default 2), LAYERS, ALGOS (default "gptq awq"), DTYPES (default "bf16 fp32"), CHUNKS (calibration
# chunks of 512 tokens, default 32). Wall and CPU (user + sys) seconds are printed: on a shared
# host the CPU time is the steadier figure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nibble="${NIBBLE:-$here/../build/release/nibble}"
data="$here/../../shared/data/prose-calib.txt"
work="${SCALE_DIR:-/tmp/nibble-scale}"
threads="${THREADS:-2}"

calib() {
  local layers="${LAYERS:-2}" algos="${ALGOS:-gptq awq}" dtypes="${DTYPES:-bf16 fp32}" chunks="${CHUNKS:-32}"
  mkdir -p "$work"
  local model="$work/7b-${layers}l"
  if [ ! -f "$model/config.json" ]; then
    sed "s/\"num_hidden_layers\": *32/\"num_hidden_layers\": $layers/" "$here/configs/llama2-7b.json" > "$work/7b-${layers}l.json"
    "$nibble" synth --config "$work/7b-${layers}l.json" --out "$model" --format dense \
      --tokenizer_dir "$here/../models/prose-llama-7m" -t "$threads" > /dev/null
  fi
  printf 'calib: Llama-2-7B shape, %s decoder layer(s), %s x 512 calibration tokens, %s threads, load %s\n' \
    "$layers" "$chunks" "$threads" "$(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f '%e %U %S' -o "$work/t" "$nibble" perplexity --model "$model" --text "$data" --seq_len 512 \
    --max_windows "$chunks" -t "$threads" > /dev/null 2>&1
  printf 'fp forward (perplexity over the same tokens, incl. load, tokenize, lm_head): %s\n' \
    "$(awk '{ printf "%.1f s wall, %.1f s CPU", $1, $2 + $3 }' "$work/t")"
  local algo dt per
  for algo in $algos; do
    for dt in $dtypes; do
      rm -rf "$work/q"
      /usr/bin/time -f '%e %U %S' -o "$work/t" "$nibble" quantize --model_dir "$model" --output_dir "$work/q" \
        --quant_algo "$algo" --dataset "$data" --num_calib_data "$chunks" --seq_len 512 --calib_dtype "$dt" -t "$threads" --report "$work/r.json" > "$work/q.log" 2>&1
      per=$(python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["calib_layers"]; print("%.1f" % (sum(x["seconds"] for x in l)/len(l)))' "$work/r.json")
      printf '%-5s --calib_dtype %s: %6s s per layer (wall); x 32 layers = %5.1f min; whole run %s; %s\n' "$algo" \
        "$dt" "$per" "$(awk -v l="$per" 'BEGIN { print l * 32 / 60 }')" \
        "$(awk '{ printf "%.1f s wall, %.1f s CPU", $1, $2 + $3 }' "$work/t")" "$(grep '^memory:' "$work/q.log" || true)"
    done
  done
  rm -rf "$work/q" "$work/r.json" "$work/q.log" "$work/t"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$model" "$work/7b-${layers}l.json"
}

case "${1:-}" in
  calib) calib ;;
  *) echo "usage: bash bench/scale.sh calib" >&2; exit 2 ;;
esac
