#!/usr/bin/env bash
# Decode (tg) and prefill (pp) tokens/s of nibble against llama.cpp on the same random weights.
#
# Builds llama.cpp from the source tree given (never downloaded or kept in this repository),
# writes one random-weight checkpoint with `nibble synth --format dense --llama2c` (TinyLlama-1.1B
# shapes unless -c), converts the same weights for llama.cpp (llama-convert-llama2c-to-ggml, then
# llama-quantize Q4_0: its default recipe, output.weight Q6_K) and for nibble (`nibble quantize`:
# Quark uint4 g128 RTN, lm_head included), then runs ROUNDS interleaved rounds; each round, per
# thread count: the DRAM read bandwidth (`nibble bench --no_gemm`), `llama-bench`, `nibble
# bench-model` for each activation mode, the bandwidth again. Prints per engine/mode, test and
# thread count the median and range over rounds, the ratio to llama.cpp's median, the bandwidth
# measured in the same blocks, and decode's share of it (bytes per token: the weights without
# the embedding table, which decode reads one row of).
#
# With -P (batched decode, default 8; "" skips it) each round also runs `llama-batched-bench`
# (-npp 32 -ntg N -npl P) beside `bench-model -P 1,P`: aggregate decode tokens/s of P sequences.
# The host line names the CPU model, family / model / stepping and microcode.
#
# Usage: bench/vs_llamacpp.sh [-r ROUNDS] [-t "1 2 4 ... all cores"] [-p 512] [-n 64] [-a "auto"]
#                             [-P "8"] [-c CONFIG.json] LLAMA_CPP_SOURCE_DIR [WORK_DIR (build/vs_llamacpp)]
# NIBBLE_BENCH_ARGS in the environment: more flags for every bench-model run (e.g. "--no_mmap").
# nibble's packed-weight cache lives in WORK_DIR/cache; both engines' files are read back into the
# page cache before the rounds.
# Needs: cmake and a C++ compiler (for llama.cpp), python3 (the summary). llama.cpp's converter
# holds the fp32 model in one ggml context, 2 GiB in some versions (b4748 among them): about 500M
# parameters, less than TinyLlama-1.1B; the script then says so and -c takes a smaller config. Checkpoints are kept in
# WORK_DIR and reused (delete it to redo them); llama.cpp is rebuilt incrementally, in WORK_DIR
# (bench/serve.sh -L shares it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# Thread counts: powers of two up to all cores, and all cores.
all_threads() {
  local t=1 c
  c="$(nproc)"
  while [ "$t" -lt "$c" ]; do printf '%s ' "$t"; t=$((t * 2)); done
  echo "$c"
}
rounds=5 threads="$(all_threads)" p=512 n=64 modes="auto" par=8 config="$root/bench/configs/tinyllama-1.1b.json"
while getopts "r:t:p:n:a:P:c:" o; do
  case "$o" in
    r) rounds="$OPTARG" ;; t) threads="$OPTARG" ;; p) p="$OPTARG" ;; n) n="$OPTARG" ;;
    a) modes="$OPTARG" ;; P) par="$OPTARG" ;; c) config="$OPTARG" ;;
    *) echo "usage: $0 [-r ROUNDS] [-t THREADS] [-p N] [-n N] [-a MODES] [-P PARALLEL] [-c CONFIG] LLAMA_CPP_SOURCE_DIR [WORK_DIR]" >&2
       exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "error: give the llama.cpp source directory (LLAMA_CPP_SOURCE_DIR)" >&2; exit 2; }
src="$(cd "$1" && pwd)"
[ -f "$src/CMakeLists.txt" ] || { echo "error: $src: no CMakeLists.txt (expected a llama.cpp source tree)" >&2; exit 2; }
work="${2:-$root/build/vs_llamacpp}"
mkdir -p "$work/results"
work="$(cd "$work" && pwd)"
nibble="$root/build/release/nibble"
(cd "$root" && cmake --preset release >/dev/null && cmake --build --preset release --target nibble >/dev/null)

# llama.cpp, native build of the two programs used (bench/llamacpp.sh), then the same weights for
# both: the llama.cpp copy from the llama2.c files, the nibble copy from the dense checkpoint they
# were written beside.
# shellcheck source=bench/llamacpp.sh
source "$root/bench/llamacpp.sh"
llamacpp_build "$src" "$work" llama-bench llama-batched-bench llama-quantize llama-convert-llama2c-to-ggml
llama_bench="$(llamacpp_bin llama-bench)"
llama_batched="$(llamacpp_bin llama-batched-bench)"
llamacpp_same_weights "$nibble" "$config" "$work"

# Both engines stream their weights from the page cache (llama.cpp maps the GGUF, nibble its packed
# weight cache). Pages left by a writer on a busy machine decoded up to a quarter slower than the
# same file read back (docs/PERFORMANCE.md "On a Zen 4 host"), so every model file is dropped from
# the page cache and read back once before the rounds: both engines then read pages made alike.
# (Checkpoints under 256 MiB get no cache: nibble then reads nibble-q's safetensors.)
export NIBBLE_CACHE_DIR="$work/cache"
"$nibble" bench-model -m "$work/nibble-q" -p 0 -n 1 -r 1 -t 1 >>"$work/bench-model.log" 2>&1 ||
  { echo "error: nibble bench-model failed (see $work/bench-model.log)" >&2; exit 1; }  # packs the cache
shopt -s nullglob
model_files=("$work/q4_0.gguf" "$NIBBLE_CACHE_DIR"/weights/*.w4p "$work"/nibble-q/*.safetensors)
shopt -u nullglob
python3 - "${model_files[@]}" <<'PY'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    while os.read(fd, 1 << 24):
        pass
    os.close(fd)
PY

bandwidth() {  # GB/s with $1 threads
  "$nibble" bench --no_gemm -t "$1" --bandwidth_gib 1 | sed -n 's/^DRAM read bandwidth: \([0-9.]*\) GB\/s.*/\1/p'
}
rm -f "$work"/results/*.json "$work"/results/*.jsonl "$work"/results/*.bw
plist=1${par:+,$par}
for r in $(seq 1 "$rounds"); do
  for t in $threads; do
    bandwidth "$t" >>"$work/results/bw-t$t.bw"
    "$llama_bench" -m "$work/q4_0.gguf" -p "$p" -n "$n" -t "$t" -r 1 -o json >"$work/results/llama-r$r-t$t.json" \
      2>>"$work/llama-bench.log"
    if [ -n "$par" ]; then
      "$llama_batched" -m "$work/q4_0.gguf" -c $(((32 + n) * ${par##*,})) -npp 32 -ntg "$n" -npl "$par" -t "$t" \
        --output-format jsonl 2>>"$work/llama-batched-bench.log" | grep '^{' >"$work/results/llamabb-r$r-t$t.jsonl"
    fi
    for a in $modes; do
      # shellcheck disable=SC2086
      "$nibble" bench-model -m "$work/nibble-q" -p "$p" -n "$n" -P "$plist" -t "$t" -r 1 --activations "$a" --json \
        ${NIBBLE_BENCH_ARGS:-} >"$work/results/nibble-$a-r$r-t$t.json" 2>>"$work/bench-model.log"
    done
    bandwidth "$t" >>"$work/results/bw-t$t.bw"
  done
  echo "round $r of $rounds done" >&2
done

cpuinfo() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
echo "host: $(cpuinfo 'model name') (family $(cpuinfo 'cpu family') model $(cpuinfo model) stepping" \
  "$(cpuinfo stepping), microcode $(cpuinfo microcode)), $(nproc) cores;" \
  "nibble $(git -C "$root" rev-parse --short HEAD); llama.cpp source $src" \
  "($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "not a git tree"));" \
  "bench-model flags: ${NIBBLE_BENCH_ARGS:-none}"
python3 - "$work/results" "$config" <<'EOF'
import glob, json, os, statistics, sys
res, cfg = sys.argv[1], json.load(open(sys.argv[2]))
first = json.load(open(sorted(glob.glob(os.path.join(res, "llama-*.json")))[0]))[0]
print(f"llama.cpp build {first.get('build_number')} ({first.get('build_commit')}), {first.get('cpu_info')}")
emb = cfg["vocab_size"] * cfg["hidden_size"]  # embedding elements: one row read per token
rows = {}  # (engine, test, threads) -> [tokens/s per round]
size = {}  # engine -> bytes read per decoded token
for f in sorted(glob.glob(os.path.join(res, "llamabb-*.jsonl"))):  # aggregate decode of pl sequences
    for line in open(f):
        e = json.loads(line)
        if e["pl"] > 1:
            rows.setdefault(("llama.cpp Q4_0", f"tg{e['tg']} x{e['pl']}", e["n_threads"]), []).append(e["speed_tg"])
for f in sorted(glob.glob(os.path.join(res, "*.json"))):
    name = os.path.basename(f)
    engine = "llama.cpp Q4_0" if name.startswith("llama-") else "nibble " + name.split("-")[1]
    for e in json.load(open(f)):
        test = f"pp{e['n_prompt']}" if e["n_prompt"] else f"tg{e['n_gen']}"
        if e.get("n_parallel", 1) > 1:
            test += f" x{e['n_parallel']}"
        ts = e.get("avg_ts", e.get("median_ts"))
        if engine.startswith("nibble"):
            engine = "nibble " + e["activations"]
        rows.setdefault((engine, test, e["n_threads"]), []).append(ts)
        size[engine] = e["model_size"] - emb * (18 / 32 if engine.startswith("llama") else 2)
bw = {}
for f in glob.glob(os.path.join(res, "bw-t*.bw")):
    vals = [float(x) for x in open(f).read().split()]
    bw[int(os.path.basename(f)[4:-3])] = vals
print(f"{'engine':<22} {'test':>9} {'thr':>3} {'median t/s':>11} {'range':>17} {'vs llama.cpp':>12} {'% of bw':>8}"
      f" {'bw GB/s median (range)':>24}")
for (engine, test, t), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
    med = statistics.median(v)
    ref = rows.get(("llama.cpp Q4_0", test, t))
    ratio = f"{med / statistics.median(ref):.2f}x" if ref else "-"
    b = bw.get(t, [])
    single = test.startswith("tg") and " x" not in test  # one sequence: bytes per token known
    share = f"{100 * med * size[engine] / (statistics.median(b) * 1e9):.0f} %" if b and single else ""
    brange = f"{statistics.median(b):.1f} ({min(b):.1f}-{max(b):.1f})" if b else "-"
    print(f"{engine:<22} {test:>9} {t:>3} {med:>11.1f} {min(v):>8.1f}-{max(v):<8.1f} {ratio:>12} {share:>8} {brange:>24}")
EOF
