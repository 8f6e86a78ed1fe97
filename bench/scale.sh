#!/usr/bin/env bash
# Scale checks of `nibble quantize` on real-width random-weight checkpoints (`nibble synth
# --format dense`). One function per section; the section's name is the first argument:
#
#   bash bench/scale.sh depth    # peak memory of 2 against 4 layers at 70B width, against the plan
#
# Environment: NIBBLE (the binary, default build/release/nibble), SCALE_DIR (where checkpoints are
# made, default build/scale; each is deleted after its section unless SCALE_KEEP=1), and per
# section the variables it names. Results go to docs/PERFORMANCE.md with the command, the commit
# and the host CPU.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
NIBBLE=${NIBBLE:-$ROOT/build/release/nibble}
SCALE_DIR=${SCALE_DIR:-$ROOT/build/scale}
SCALE_KEEP=${SCALE_KEEP:-0}

# A config from bench/configs/$1 with the JSON keys of $2 (a Python dict literal) replaced, as $3.
edited_config() {
  python3 - "$ROOT/bench/configs/$1" "$2" "$3" <<'EOF'
import ast, json, sys
c = json.load(open(sys.argv[1]))
c.update(ast.literal_eval(sys.argv[2]))
json.dump(c, open(sys.argv[3], "w"), indent=2)
EOF
}

# One quantize run of checkpoint $1 with the flags after it: "<measured peak> <planned peak>" in
# bytes, from --json (the run's own sampler of RssAnon and the plan made before its first layer).
peaks() {
  local dir=$1
  shift
  "$NIBBLE" quantize --model_dir "$dir" --output_dir "$dir.out" --overwrite --json "$@" 2>"$dir.log" |
    python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["peak_anon_bytes"], j["plan"]["peak_anon_bytes"])'
  grep -E '^plan:' "$dir.log" >&2
  rm -rf "$dir.out"
}

# depth: memory must not grow with depth. Llama-3-70B width (bench/configs/llama3-70b.json:
# hidden_size 8192, intermediate_size 28672, 64 / 8 heads) with vocab_size 32000 (width is what is
# tested; the embedding stays small), 2 and 4 decoder layers, quantized with DEPTH_ALGO (rtn;
# gptq or awq with DEPTH_CALIB calibration, default "--num_calib_data 2 --seq_len 64"), extra
# flags in DEPTH_FLAGS (e.g. --max_memory 12GB: a 70B-wide GPTQ layer plans about 16 GB).
# Prints both peaks, the plans and the ratio; exits 1 when the 4-layer peak is more than 10 %
# above or below the 2-layer one, or a peak is above its plan.
depth() {
  local algo=${DEPTH_ALGO:-rtn} calib=${DEPTH_CALIB:---num_calib_data 2 --seq_len 64}
  local flags=(--quant_algo "$algo")
  [ "$algo" != rtn ] && flags+=(--dataset "$ROOT/../shared/data/prose-calib.txt" $calib)
  # shellcheck disable=SC2206
  flags+=(${DEPTH_FLAGS:-})
  mkdir -p "$SCALE_DIR"
  local -A measured planned
  for layers in 2 4; do
    local dir=$SCALE_DIR/llama3-70b-wide-${layers}l
    if [ ! -f "$dir/config.json" ]; then
      edited_config llama3-70b.json "{'num_hidden_layers': $layers, 'vocab_size': 32000}" "$SCALE_DIR/config-${layers}l.json"
      "$NIBBLE" synth --config "$SCALE_DIR/config-${layers}l.json" --out "$dir" --format dense \
        --tokenizer_dir "$ROOT/models/prose-llama-7m" >/dev/null
    fi
    read -r "measured[$layers]" "planned[$layers]" < <(peaks "$dir" "${flags[@]}")
    [ "$SCALE_KEEP" = 1 ] || rm -rf "$dir" "$dir.log"
  done
  python3 - "${measured[2]}" "${measured[4]}" "${planned[2]}" "${planned[4]}" "$algo" <<'EOF'
import sys
m2, m4, p2, p4 = (int(x) for x in sys.argv[1:5])
ratio = m4 / m2
print(f"depth ({sys.argv[5]}, 70B width): peak anonymous 2 layers {m2 / 1e6:.1f} MB (plan {p2 / 1e6:.1f} MB, "
      f"{p2 / m2:.2f}x), 4 layers {m4 / 1e6:.1f} MB (plan {p4 / 1e6:.1f} MB, {p4 / m4:.2f}x); 4 / 2 layers {ratio:.3f}")
bad = []
if abs(ratio - 1) > 0.10: bad.append(f"the 4-layer peak is {100 * (ratio - 1):+.1f} % from the 2-layer one (bound 10 %)")
if m2 > p2 or m4 > p4: bad.append("a measured peak is above its plan")
for b in bad: print("FAIL: " + b)
sys.exit(1 if bad else 0)
EOF
}

case "${1:-}" in
  depth) depth ;;
  *)
    echo "usage: bash bench/scale.sh depth" >&2
    exit 2
    ;;
esac
