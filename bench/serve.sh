#!/usr/bin/env bash
# `nibble serve` under load: aggregate decode tokens/s and time to first token (p50, p99) with
# 1, 2, 4, 8 (-s) concurrent streamed completions, on a random-weight int4 model of real shapes
# (`nibble synth --format quark`, TinyLlama-1.1B unless -c). One server (--parallel = the largest
# stream count) answers every row; each row runs ROUNDS rounds of S streams of P-token prompts
# and N generated tokens (bench/serve_bench.cjs). The checkpoint is kept in WORK_DIR and reused.
#
# Usage: bench/serve.sh [-s "1 2 4 8"] [-p 256] [-n 64] [-r 2] [-t THREADS] [-c CONFIG.json] [WORK_DIR (build/bench_serve)]
# Needs: the built CLI (build/release/nibble), node >= 18.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
streams="1 2 4 8" p=256 n=64 rounds=2 threads=0 config="$root/bench/configs/tinyllama-1.1b.json"
while getopts "s:p:n:r:t:c:" o; do
  case "$o" in
    s) streams="$OPTARG" ;; p) p="$OPTARG" ;; n) n="$OPTARG" ;; r) rounds="$OPTARG" ;; t) threads="$OPTARG" ;;
    c) config="$OPTARG" ;;
    *) echo "usage: $0 [-s STREAMS] [-p N] [-n N] [-r ROUNDS] [-t THREADS] [-c CONFIG] [WORK_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
work="${1:-$root/build/bench_serve}"
nibble="$root/build/release/nibble"
[[ -x "$nibble" ]] || { echo "serve.sh: build the CLI first ($nibble not found)" >&2; exit 1; }
model="$work/$(basename "$config" .json)-quark"
mkdir -p "$work"
[[ -f "$model/config.json" ]] || "$nibble" synth --config "$config" --out "$model" --format quark >&2
max=0
for s in $streams; do ((s > max)) && max=$s; done
log="$work/serve.log"
"$nibble" serve --model "$model" --port 0 --parallel "$max" --ctx_size $((p + n + 16)) --threads "$threads" 2> "$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
port=""
for _ in $(seq 600); do
  port="$(grep -o 'ready on port [0-9]*' "$log" | grep -o '[0-9]*$' || true)"
  [[ -n "$port" ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.2
done
[[ -n "$port" ]] || { echo "serve.sh: the server did not start" >&2; cat "$log" >&2; exit 1; }
echo "model $model, prompt $p tokens, $n generated, $rounds rounds, threads $threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
printf '%8s %14s %12s %12s\n' streams decode_tok/s ttft_p50_ms ttft_p99_ms
for s in $streams; do
  node "$root/bench/serve_bench.cjs" "http://127.0.0.1:$port" "$s" "$p" "$n" "$rounds" |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("%8d %14.1f %12.0f %12.0f" % (j["streams"], j["decode_tok_s"], j["ttft_ms_p50"], j["ttft_ms_p99"]))'
done
