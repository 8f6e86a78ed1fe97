#!/usr/bin/env bash
# AWQ wall time vs the fp forward pass over the same calibration tokens (acceptance target:
# AWQ of prose-llama-7m with 128 x 512 calibration tokens in < 2 minutes on 2 cores).
#
# The fp forward is `nibble perplexity` over the first N windows of 512 tokens of
# [BOS] + encode(prose-calib.txt) — exactly the N calibration chunks AWQ uses with --seed 0.
# The ratio AWQ / forward is the figure to watch: AWQ runs ~20 forwards of each inspected
# sub-block per mapping (n_grid 20) plus the propagation forward.
#
# Usage: bench/awq_time.sh [--model DIR] [--data FILE] [--chunks 128] [--seq_len 512] [--threads 2] [--nibble BIN]
# (pin to 2 cores with e.g. `taskset -c 0,1 bench/awq_time.sh`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
model="$here/../../shared/models/prose-llama-7m"
data="$here/../../shared/data/prose-calib.txt"
chunks=128 seq_len=512 threads=2
nibble="$here/../build/release/nibble"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --seq_len) seq_len="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --nibble) nibble="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ! -x "$nibble" ]; then (cd "$here/.." && cmake --build --preset release --target nibble); fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
now() { date +%s.%N; }
t0=$(now)
"$nibble" perplexity --model "$model" --text "$data" --seq_len "$seq_len" --max_windows "$chunks" -t "$threads" > "$out/ppl.txt" 2>/dev/null
t1=$(now)
"$nibble" quantize --model_dir "$model" --output_dir "$out/awq" --quant_algo awq --dataset "$data" \
  --num_calib_data "$chunks" --seq_len "$seq_len" -t "$threads" > "$out/awq.txt" 2>/dev/null
t2=$(now)
fwd=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
awq=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')
printf 'model %s, %s x %s calibration tokens, %s threads\n' "$model" "$chunks" "$seq_len" "$threads"
printf 'fp forward (perplexity over the same tokens, incl. load + tokenize): %8.1f s\n' "$fwd"
printf 'AWQ quantize (incl. load + tokenize + export):                      %8.1f s\n' "$awq"
printf 'ratio AWQ / forward: %.1f\n' "$(awk -v a="$awq" -v f="$fwd" 'BEGIN { print a / f }')"
grep '^AWQ:' "$out/awq.txt" || true
