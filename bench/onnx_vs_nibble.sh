#!/usr/bin/env bash
# Prefill (pp) and decode (tg) tokens/s of nibble vs. ONNX Runtime (CPU EP) on nibble export-onnx
# decoders of the same int4 checkpoints: prose-llama-7m (Quark uint4 g128, lm_head g32, as
# tests/e2e/onnx_export_test.cc quantizes it) and a random-weight TinyLlama-1.1B-shaped model
# (uint4 g128, lm_head included), each exported at --accuracy_level 0 and 4. Also reports the
# wall time and peak RSS of the TinyLlama export. ORT runs bench/ort_bench.js; nibble runs
# `nibble bench-model` (default activations and int8); both: random ids, one warmup, median of 2
# repetitions.
# Usage: bench/onnx_vs_nibble.sh [-t THREADS] [-p 128] [-n 64] [WORK_DIR (default build/onnx_bench)]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
threads=1 p=128 n=64 reps=2
while getopts "t:p:n:" o; do
  case "$o" in
    t) threads="$OPTARG" ;; p) p="$OPTARG" ;; n) n="$OPTARG" ;;
    *) echo "usage: $0 [-t THREADS] [-p PROMPT] [-n GEN] [WORK_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
work="${1:-$root/build/onnx_bench}"
nibble="$root/build/release/nibble"
(cd "$root" && cmake --build --preset release --target nibble nibble-export-onnx >/dev/null)
bash "$root/scripts/install_node_packages.sh"
modules="$root/build/npm/node_modules"
[ -d "$modules/onnxruntime-node" ] || { echo "error: onnxruntime-node not in $modules" >&2; exit 1; }
command -v node >/dev/null || { echo "error: node not found in PATH" >&2; exit 1; }
mkdir -p "$work"

# Checkpoints, written once (delete WORK_DIR to redo them).
if [ ! -d "$work/prose-q" ]; then
  "$nibble" quantize --model_dir "$root/models/prose-llama-7m" --output_dir "$work/prose-q" \
    --quant_scheme w_uint4_per_group_asym --group_size 128 --exclude_layers '' \
    --layer_quant_config lm_head:group_size=32 >/dev/null
fi
if [ ! -d "$work/tinyllama-q" ]; then
  "$nibble" synth --config "$root/bench/configs/tinyllama-1.1b.json" --format dense \
    --out "$work/tinyllama-dense" --overwrite >/dev/null
  "$nibble" quantize --model_dir "$work/tinyllama-dense" --output_dir "$work/tinyllama-q" \
    --quant_scheme w_uint4_per_group_asym --group_size 128 --exclude_layers '' >/dev/null
  rm -rf "$work/tinyllama-dense"
fi

# Exports (always redone: the TinyLlama one at level 4 is timed).
export_stats=""
for m in prose tinyllama; do
  for level in 0 4; do
    out="$work/$m-onnx-acc$level"
    /usr/bin/time -v "$nibble" export-onnx --model "$work/$m-q" --out "$out" --accuracy_level "$level" \
      --overwrite >/dev/null 2>"$work/$m-export-acc$level.time"
    if [ "$m" = tinyllama ] && [ "$level" = 4 ]; then
      wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$work/$m-export-acc$level.time")
      rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/$m-export-acc$level.time")
      export_stats="TinyLlama-1.1B export (--accuracy_level 4): wall $wall, peak RSS $((rss / 1024)) MiB ($rss kB)"
    fi
  done
done

# Each ORT level against the nibble mode with its activation numerics: level 0 (fp32 activations
# into MatMulNBits) against nibble's default (auto: bf16), level 4 (int8 activations) against int8.
printf '%-16s %-14s %10s %10s %14s\n' model engine "pp$p t/s" "tg$n t/s" "nibble/ORT pp,tg"
for m in prose tinyllama; do
  js=$("$nibble" bench-model -m "$work/$m-q" -p "$p" -n "$n" -t "$threads" -r "$reps" --activations auto,int8 --json)
  for level in 0 4; do
    mode=$([ "$level" = 0 ] && echo auto || echo int8)
    sel=".[] | select(.activations | startswith(\"$mode\"))"
    nib_pp=$(jq -r "$sel | select(.test | startswith(\"pp\")) | .median_ts" <<<"$js")
    nib_tg=$(jq -r "$sel | select(.test | startswith(\"tg\")) | .median_ts" <<<"$js")
    name=$(jq -r "[$sel | .activations][0]" <<<"$js")
    printf '%-16s %-14s %10.1f %10.1f\n' "$m" "nibble $name" "$nib_pp" "$nib_tg"
    ort=$(NODE_PATH="$modules" node "$root/bench/ort_bench.js" "$work/$m-onnx-acc$level" "$p" "$n" "$threads" "$reps")
    ort_pp=$(jq -r .pp_ts <<<"$ort") ort_tg=$(jq -r .tg_ts <<<"$ort")
    printf '%-16s %-14s %10.1f %10.1f %7.2f,%5.2f\n' "$m" "ORT acc$level" "$ort_pp" "$ort_tg" \
      "$(jq -n "$nib_pp / $ort_pp")" "$(jq -n "$nib_tg / $ort_tg")"
  done
done
echo "$export_stats"
echo "threads $threads, commit $(git -C "$root" rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
