#!/usr/bin/env bash
# Real-size runs, one section per function:
#   bash bench/scale.sh SECTION [DIR]       NIBBLE=path/to/nibble  OUT=scratch output dir
# Sections:
#   rtn  `nibble quantize` RTN (the default flags) of the checkpoint DIR against `cat` of its
#        shards: both read the input cold-ish (its pages dropped from the page cache first with
#        posix_fadvise DONTNEED), GB/s of input for both and their ratio, user / system time,
#        minor faults and peak RSS (/usr/bin/time -v), the run's `memory:` line. DIR defaults
#        to /work/big/llama2-7b, made by
#          nibble synth --config bench/configs/llama2-7b.json --format dense --out DIR \
#            --tokenizer_dir ../shared/models/prose-llama-7m
# Prints the CPU model and the load average (the figures mean little on a busy host).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NIBBLE=${NIBBLE:-$ROOT/build/release/nibble}

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
  local dir=${1:-/work/big/llama2-7b} out=${OUT:-/tmp/nibble-scale-rtn}
  [ -d "$dir" ] || { echo "scale.sh rtn: no checkpoint at $dir (see the header for how to make it)" >&2; exit 1; }
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

case "${1:-}" in
  rtn) shift; section_rtn "$@" ;;
  *) echo "usage: bash bench/scale.sh rtn [DIR]" >&2; exit 2 ;;
esac
