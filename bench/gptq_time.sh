#!/usr/bin/env bash
# GPTQ wall time against the fp forward pass over the same calibration tokens, measured in the
# same run (targets: GPTQ of prose-llama-7m with 128 x 512 calibration tokens in < 60 s on 2
# cores and <= 5x one fp forward), then one Llama-2-7B-shaped decoder layer (random weights from
# `nibble synth`, 32 x 512 calibration tokens) extrapolated to 32 layers (target <= 20 min).
#
# The fp forward is `nibble perplexity` over the first N windows of 512 tokens of
# [BOS] + encode(prose-calib.txt) — exactly the N calibration chunks GPTQ uses with --seed 0.
#
# Usage: bench/gptq_time.sh [--model DIR] [--data FILE] [--chunks 128] [--threads 2] [--no_7b]
#        [--nibble BIN]   (pin to 2 cores with e.g. `taskset -c 0,1 bench/gptq_time.sh`)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
model="$here/../../shared/models/prose-llama-7m"
data="$here/../../shared/data/prose-calib.txt"
chunks=128 threads=2 big=1
nibble="$here/../build/release/nibble"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --no_7b) big=0; shift ;;
    --nibble) nibble="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ! -x "$nibble" ]; then (cd "$here/.." && cmake --build --preset release --target nibble); fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

t0=$(now)
"$nibble" perplexity --model "$model" --text "$data" --seq_len 512 --max_windows "$chunks" -t "$threads" > /dev/null 2>&1
t1=$(now)
"$nibble" quantize --model_dir "$model" --output_dir "$out/gptq" --quant_algo gptq --dataset "$data" \
  --num_calib_data "$chunks" --seq_len 512 -t "$threads" > "$out/gptq.txt" 2>/dev/null
t2=$(now)
fwd=$(elapsed "$t0" "$t1") gptq=$(elapsed "$t1" "$t2")
printf 'model %s, %s x 512 calibration tokens, %s threads\n' "$model" "$chunks" "$threads"
printf 'fp forward (perplexity over the same tokens, incl. load + tokenize): %8.1f s\n' "$fwd"
printf 'GPTQ quantize (incl. load + tokenize + export):                     %8.1f s\n' "$gptq"
printf 'ratio GPTQ / forward: %.1f\n' "$(awk -v a="$gptq" -v f="$fwd" 'BEGIN { print a / f }')"
grep -E '^(GPTQ:|  GPTQ Hessians)' "$out/gptq.txt" || true

[ "$big" = 1 ] || exit 0
# One Llama-2-7B decoder layer: the config with num_hidden_layers 1 (embedding and lm_head at
# full size, ~0.9 GB of bf16 on disk).
sed 's/"num_hidden_layers": *32/"num_hidden_layers": 1/' "$here/configs/llama2-7b.json" > "$out/7b-1layer.json"
"$nibble" synth --config "$out/7b-1layer.json" --out "$out/7b" --format dense -t "$threads" > /dev/null
"$nibble" quantize --model_dir "$out/7b" --output_dir "$out/7b-gptq" --quant_algo gptq --dataset "$data" \
  --num_calib_data 32 --seq_len 512 -t "$threads" --report "$out/7b.json" > "$out/7b.txt" 2>/dev/null
layer=$(sed -n 's/^  layer 0 (\([0-9.]*\) s).*/\1/p' "$out/7b.txt")
printf 'Llama-2-7B-shaped layer, 32 x 512 calibration tokens: %s s per layer; x 32 layers = %.1f min\n' \
  "$layer" "$(awk -v l="$layer" 'BEGIN { print l * 32 / 60 }')"
grep -E '^  GPTQ Hessians' "$out/7b.txt" || true
