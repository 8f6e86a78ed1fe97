#!/usr/bin/env bash
# Real-size checks of `nibble quantize` on random-weight checkpoints (`nibble synth --format
# dense`), one function per section; the section's name is the first argument:
#   bash bench/scale.sh rtn [DIR]   RTN (the default flags) of the checkpoint DIR against `cat` of its
#        shards: both read the input cold-ish (its pages dropped from the page cache first with
#        posix_fadvise DONTNEED), GB/s of input for both and their ratio, user / system time,
#        minor faults and peak RSS (/usr/bin/time -v), the run's `memory:` line. DIR defaults
#        to $SCALE_DIR/llama2-7b, made when missing by `nibble synth --config
#        bench/configs/llama2-7b.json --format dense` (13.5 GB, kept for the next run)
#   bash bench/scale.sh depth       peak memory of 2 against 4 layers at 70B width, against the plan
#   bash bench/scale.sh calib       AWQ and GPTQ with bf16 and fp32 calibration (--calib_dtype) on
#        LAYERS (default 2) decoder layers of the Llama-2-7B shape, CHUNKS (default 32) x 512
#        calibration tokens, and one fp forward over the same tokens (`nibble perplexity`); per-layer
#        seconds (the --report's calib_layers) extrapolated to 32 layers (the first + 31 x the
#        others). ALGOS (default "gptq awq"), DTYPES (default "bf16 fp32"), THREADS (default 2); wall
#        and CPU (user + sys) seconds are printed: on a shared host the CPU time is the steadier figure.
# Environment: NIBBLE (the binary, default build/release/nibble), OUT (rtn's scratch output),
# SCALE_DIR (where depth makes checkpoints, default build/scale; each is deleted after its section
# unless SCALE_KEEP=1), and per section the variables it names. Prints the CPU model and the load
# average (the figures mean little on a busy host); results go to docs/PERFORMANCE.md with the
# command, the commit and the host CPU.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NIBBLE=${NIBBLE:-$ROOT/build/release/nibble}
SCALE_DIR=${SCALE_DIR:-$ROOT/build/scale}
SCALE_KEEP=${SCALE_KEEP:-0}
THREADS=${THREADS:-2}
CALIB_DATA=$ROOT/../shared/data/prose-calib.txt

shards() { ls "$1"/*.safetensors; }
input_bytes() { shards "$1" | xargs stat -c %s | awk '{s += $1} END {printf "%.0f\n", s}'; }
# Drops the files' pages from the page cache (what is not dirty or mapped), so a read goes to disk.
drop_cache() {
  python3 - "$@" <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
host() {
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
}
# `label`, bytes read, the /usr/bin/time -v file: one line of figures.
figures() {
  awk -v label="$1" -v bytes="$2" -F': ' '
    /Elapsed \(wall clock\)/ { n = split($2, t, ":"); wall = 0; for (i = 1; i <= n; ++i) wall = wall * 60 + t[i] }
    /User time/ { user = $2 } /System time/ { sys = $2 }
    /Minor \(reclaiming/ { minor = $2 } /Major \(requiring/ { major = $2 }
    /Maximum resident/ { rss = $2 }
    END { printf "%-9s %6.1f s  %5.2f GB/s of input  user %.1f s  sys %.1f s  faults %d minor %d major  peak RSS %.0f MB\n",
                 label, wall, bytes / wall / 1e9, user, sys, minor, major, rss / 1024; print wall > "/dev/stderr" }' "$3"
}

section_rtn() {
  local dir=${1:-$SCALE_DIR/llama2-7b} out=${OUT:-$SCALE_DIR/rtn.out}
  mkdir -p "$SCALE_DIR"
  if [ ! -f "$dir/config.json" ]; then
    echo "making $dir (13.5 GB)" >&2
    "$NIBBLE" synth --config "$ROOT/bench/configs/llama2-7b.json" --format dense --out "$dir" \
      --tokenizer_dir "$ROOT/models/prose-llama-7m" >/dev/null
  fi
  local bytes; bytes=$(input_bytes "$dir")
  local tmp; tmp=$(mktemp -d)
  host
  echo "input: $dir, $(shards "$dir" | wc -l) shards, $((bytes / 1000000)) MB; $($NIBBLE --version | head -1)"
  drop_cache $(shards "$dir")
  /usr/bin/time -v -o "$tmp/cat.time" cat $(shards "$dir") > /dev/null
  local cat_s; cat_s=$(figures cat "$bytes" "$tmp/cat.time" 2> "$tmp/cat.wall")
  echo "$cat_s"
  drop_cache $(shards "$dir")
  /usr/bin/time -v -o "$tmp/rtn.time" "$NIBBLE" quantize --model_dir "$dir" --output_dir "$out" --overwrite > "$tmp/rtn.log" 2>&1 ||
    { cat "$tmp/rtn.log" >&2; exit 1; }
  figures quantize "$bytes" "$tmp/rtn.time" 2> "$tmp/rtn.wall"
  echo "quantize/cat time: $(awk -v a="$(cat "$tmp/rtn.wall")" -v b="$(cat "$tmp/cat.wall")" 'BEGIN {printf "%.2f", a / b}')"
  grep '^memory:' "$tmp/rtn.log"
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$out" "$tmp"
}

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
# flags in DEPTH_FLAGS (e.g. --max_memory 12GB: a 70B-wide GPTQ layer plans about 11.9 GB at the
# default calibration in bf16, 15.7 GB with --calib_dtype fp32).
# Prints both peaks, the plans and the ratio; exits 1 when the 4-layer peak is more than 10 %
# above or below the 2-layer one, or a peak is above its plan.
section_depth() {
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

section_calib() {
  local layers="${LAYERS:-2}" algos="${ALGOS:-gptq awq}" dtypes="${DTYPES:-bf16 fp32}" chunks="${CHUNKS:-32}"
  mkdir -p "$SCALE_DIR"
  local model="$SCALE_DIR/7b-${layers}l"
  if [ ! -f "$model/config.json" ]; then
    edited_config llama2-7b.json "{'num_hidden_layers': $layers}" "$SCALE_DIR/7b-${layers}l.json"
    "$NIBBLE" synth --config "$SCALE_DIR/7b-${layers}l.json" --out "$model" --format dense \
      --tokenizer_dir "$ROOT/models/prose-llama-7m" -t "$THREADS" > /dev/null
  fi
  printf 'calib: Llama-2-7B shape, %s decoder layer(s), %s x 512 calibration tokens, %s threads, load %s\n' \
    "$layers" "$chunks" "$THREADS" "$(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f '%e %U %S' -o "$SCALE_DIR/t" "$NIBBLE" perplexity --model "$model" --text "$CALIB_DATA" --seq_len 512 \
    --max_windows "$chunks" -t "$THREADS" > /dev/null 2>&1
  printf 'fp forward (perplexity over the same tokens, incl. load, tokenize, lm_head): %s\n' \
    "$(awk '{ printf "%.1f s wall, %.1f s CPU", $1, $2 + $3 }' "$SCALE_DIR/t")"
  local algo dt per
  for algo in $algos; do
    for dt in $dtypes; do
      rm -rf "$SCALE_DIR/q"
      /usr/bin/time -f '%e %U %S' -o "$SCALE_DIR/t" "$NIBBLE" quantize --model_dir "$model" --output_dir "$SCALE_DIR/q" \
        --quant_algo "$algo" --dataset "$CALIB_DATA" --num_calib_data "$chunks" --seq_len 512 --calib_dtype "$dt" -t "$THREADS" --report "$SCALE_DIR/r.json" > "$SCALE_DIR/q.log" 2>&1
      # The first layer also pays the first touch of the run's memory; later ones reuse it
      # (RetainFreedMemory), so 32 layers = the first + 31 x the mean of the others.
      per=$(python3 -c 'import json,sys; s=[x["seconds"] for x in json.load(open(sys.argv[1]))["calib_layers"]]; r=s[1:] or s; print("%s s per layer (wall); x 32 layers = %.1f min" % (" / ".join("%.1f" % x for x in s), (s[0] + 31 * sum(r) / len(r)) / 60))' "$SCALE_DIR/r.json")
      printf '%-5s --calib_dtype %s: %s; whole run %s; %s\n' "$algo" "$dt" "$per" \
        "$(awk '{ printf "%.1f s wall, %.1f s CPU", $1, $2 + $3 }' "$SCALE_DIR/t")" "$(grep '^memory:' "$SCALE_DIR/q.log" || true)"
    done
  done
  rm -rf "$SCALE_DIR/q" "$SCALE_DIR/r.json" "$SCALE_DIR/q.log" "$SCALE_DIR/t"
  [ "$SCALE_KEEP" = 1 ] || rm -rf "$model" "$SCALE_DIR/7b-${layers}l.json"
}

case "${1:-}" in
  rtn) shift; section_rtn "$@" ;;
  depth) section_depth ;;
  calib) section_calib ;;
  *) echo "usage: bash bench/scale.sh rtn [DIR] | depth | calib" >&2; exit 2 ;;
esac
