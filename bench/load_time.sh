#!/usr/bin/env bash
# Load time and peak RSS of a real-size int4 checkpoint, warm and cold page cache, without the
# packed-weight cache, packing into it, mapping it and copying it into memory (--no_mmap), beside
# the time to `cat` its files in the same run (the read floor). The cache lives in
# --work/weight_cache and is emptied first. Target (docs/PERFORMANCE.md "Loading"):
# first token of an 8B-shaped int4 checkpoint within 5 s warm and 2x the cold `cat`, inside
# 8 GB peak RSS.
#
# Without --model it synthesizes bench/configs/llama3.1-8b.json as a Quark int4 checkpoint
# (5.5 GB, about a minute; kept in --work for the next run). Cold: the checkpoint's files are
# dropped from the page cache first, with posix_fadvise(POSIX_FADV_DONTNEED) per file (no other
# file is evicted; the cache entry too), or `echo 1 > /proc/sys/vm/drop_caches` with --drop_caches (root).
#
# Usage: bench/load_time.sh [--model DIR] [--config CONFIG.json] [--work DIR] [--threads 2]
#        [--ctx_size 8192] [--nibble BIN] [--drop_caches]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
model="" config="$here/configs/llama3.1-8b.json" work="${TMPDIR:-/tmp}/nibble_load_time"
threads=2 ctx=8192 drop=0
nibble="$here/../build/release/nibble"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --ctx_size) ctx="$2"; shift 2 ;;
    --nibble) nibble="$2"; shift 2 ;;
    --drop_caches) drop=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ! -x "$nibble" ]; then (cd "$here/.." && cmake --build --preset release --target nibble); fi
if [ -z "$model" ]; then
  model="$work/$(basename "$config" .json)-quark"
  if [ ! -f "$model/config.json" ]; then
    mkdir -p "$work"
    echo "synthesizing $config -> $model" >&2
    "$nibble" synth --config "$config" --out "$model" --format quark -t "$threads" >&2
  fi
fi
mapfile -t files < <(find "$model" -maxdepth 1 -name '*.safetensors' | sort)
[ "${#files[@]}" -gt 0 ] || { echo "$model: no .safetensors files" >&2; exit 1; }

cache="$work/weight_cache"
drop_cache() {
  if [ "$drop" = 1 ]; then
    sync && echo 1 > /proc/sys/vm/drop_caches
  else
    sync
    python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' \
      "${files[@]}" $(find "$cache" -name '*.w4p' 2>/dev/null)
  fi
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
time_cat() {
  local t0; t0=$(now)
  cat "${files[@]}" > /dev/null
  elapsed "$t0" "$(now)"
}
# One `generate -n 1` with --weight_cache $1 (and flags $2): prints "<wall to first token> <load
# seconds> <peak RSS GiB>".
run_generate() {
  local log; log="$(mktemp)"
  local t0; t0=$(now)
  # shellcheck disable=SC2086
  /usr/bin/time -f 'maxrss_kib %M' "$nibble" generate -m "$model" -p hi -n 1 --ctx_size "$ctx" -t "$threads" \
    --weight_cache "$1" ${2:-} > /dev/null 2> "$log"
  local wall; wall=$(elapsed "$t0" "$(now)")
  local load; load=$(sed -n 's/^loaded in \([0-9.]*\) s.*/\1/p' "$log")
  local rss; rss=$(awk '/^maxrss_kib/ { printf "%.2f", $2 / 1048576 }' "$log")
  rm -f "$log"
  echo "$wall $load $rss"
}

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
bytes=$(du -cb "${files[@]}" | tail -1 | cut -f1)
echo "host: $cpu, $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
echo "commit: $(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "model: $model ($(awk -v b="$bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }') in ${#files[@]} files), threads $threads, ctx_size $ctx"
rm -rf "$cache"
drop_cache
cold_cat=$(time_cat)
drop_cache
row() { printf '%-22s %10s %12s %14s %14s\n' "$@"; }
results=()
measure() {  # label, cat seconds, --weight_cache value, more flags
  local wall load rss
  read -r wall load rss < <(run_generate "$3" "${4:-}")
  results+=("$(row "$1" "$2" "$load" "$wall" "$rss")")
}
measure "cold, no cache" "$cold_cat" off
warm_cat=$(time_cat)
measure "warm, no cache" "$warm_cat" off
measure "warm, packs the cache" "$warm_cat" "$cache"
measure "warm, cache mapped" "$warm_cat" "$cache"
measure "warm, cache copied" "$warm_cat" "$cache" --no_mmap
drop_cache
measure "cold, cache mapped" "$cold_cat" "$cache"
row "" "cat (s)" "load (s)" "first tok (s)" "peak RSS GiB"
printf '%s\n' "${results[@]}"
echo "cache entry: $(du -ch "$cache"/*.w4p 2>/dev/null | tail -1 | cut -f1)"
