#!/usr/bin/env bash
# Decode and perplexity tokens/s at 1 and all threads, under several OpenMP spin counts, on an
# idle machine and while competing busy loops run (one per core by default), interleaved so both
# conditions see the same drift. GOMP_SPINCOUNT=300000 is libgomp's own default; 0 is
# OMP_WAIT_POLICY=passive. Setting GOMP_SPINCOUNT also turns off the CLI's own default.
#   bash bench/threads_under_load.sh [MODEL_DIR]      (default: the int4 export of run.sh)
# Env: SPINS="300000 10000 0", LOAD=<busy loops> (default nproc), ROUNDS=2, TEXT=<file>.
set -euo pipefail
cd "$(dirname "$0")/.."
NIBBLE=./build/release/nibble
MODEL="${1:-build/prose-llama-7m-quark-w4-g128}"
TEXT="${TEXT:-../shared/data/prose-val.txt}"
SPINS="${SPINS:-300000 10000 0}"
LOAD="${LOAD:-$(nproc)}"
ROUNDS="${ROUNDS:-2}"
[ -x "$NIBBLE" ] || { echo "build first: cmake --build --preset release" >&2; exit 1; }
[ -d "$MODEL" ] || { echo "$MODEL: no such model directory (run scripts/run.sh first)" >&2; exit 1; }

decode() {  # tokens/s of 128 greedy decode steps
  GOMP_SPINCOUNT=$1 "$NIBBLE" generate --model "$MODEL" --prompt "Once upon a time" -n 128 --temperature 0 \
    --threads "$2" 2>&1 >/dev/null | sed -n 's/.*decode: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p'
}
ppl() {  # forward tokens/s of 8 windows of 512
  GOMP_SPINCOUNT=$1 "$NIBBLE" perplexity --model "$MODEL" --text "$TEXT" --seq_len 512 --max_windows 8 \
    --threads "$2" 2>&1 >/dev/null | sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p'
}
hogs=()
start_load() { for _ in $(seq "$LOAD"); do (while :; do :; done) & hogs+=($!); done; }
stop_load() { kill "${hogs[@]}" 2>/dev/null || true; wait "${hogs[@]}" 2>/dev/null || true; hogs=(); }
trap stop_load EXIT

printf '%-7s %-8s %7s %-10s %14s %14s\n' round machine threads spincount "decode tok/s" "ppl tok/s"
for round in $(seq "$ROUNDS"); do
  for machine in idle loaded; do
    [ "$machine" = loaded ] && start_load
    for threads in 1 "$(nproc)"; do
      for spin in $SPINS; do
        printf '%-7s %-8s %7s %-10s %14s %14s\n' "$round" "$machine" "$threads" "$spin" \
          "$(decode "$spin" "$threads")" "$(ppl "$spin" "$threads")"
      done
    done
    [ "$machine" = loaded ] && stop_load
  done
done
