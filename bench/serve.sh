#!/usr/bin/env bash
# `nibble serve` under load, alone or against llama.cpp's `llama-server` on the same weights.
#
# Burst rows: per stream count S (-s), a fresh server with S slots (`nibble serve --parallel S`,
# `llama-server -np S -c S*CTX`, CTX = P + N + 16 per sequence) answers ROUNDS rounds of S
# concurrent streamed completions of distinct random P-token prompts, N tokens each
# (bench/serve_bench.cjs): aggregate decode tokens/s with every stream decoding, and the time to
# first token (p50, p99) of those S prompts arriving together.
# Steady rows (-b, the question "how long does a new request wait while the server is busy"):
# per busy count B, a fresh server with B + SPARE slots (-S; 1: the probe finds a free slot, 0:
# it waits for a busy stream to end, the queueing a full server adds); PROBES probe
# requests with a P-token prompt on the idle server, then B clients each issuing request after
# request (BUSY_P-token prompts, N tokens each) and, once all of them decode, PROBES probes one
# after another: TTFT p50 / p99 busy against idle, and the busy streams' decode rate meanwhile.
#
# Weights: without -L, `nibble synth --format quark` of CONFIG (TinyLlama-1.1B shapes) in
# WORK_DIR (build/bench_serve). With -L LLAMA_CPP_SOURCE_DIR (or that variable in the
# environment), llama.cpp is built in WORK_DIR (build/vs_llamacpp, shared with
# bench/vs_llamacpp.sh: the same build, the same converted weights, bench/llamacpp.sh) and both
# engines run on one random checkpoint, Q4_0 for llama.cpp, uint4 g128 for nibble. llama.cpp's
# converter refuses the full TinyLlama in some versions (b4748 among them: its fp32 model must fit
# a 2 GiB context): take -c bench/configs/tinyllama-6l.json then.
#
# Usage: bench/serve.sh [-s "1 2 4 8 16"] [-p 256] [-n 64] [-r 2] [-t THREADS] [-c CONFIG.json]
#                       [-b "8"] [-B 32] [-q 8] [-S 1] [-L LLAMA_CPP_SOURCE_DIR] [-e ENGINE] [WORK_DIR]
# -s "" or -b "" skips that part; -e nibble or -e llama.cpp runs only that engine. Needs: the
# built CLI (build/release/nibble), node >= 18, python3; with -L cmake and a C++ compiler.
# NIBBLE_SERVE_ARGS / LLAMA_SERVER_ARGS in the environment: more flags for each server (e.g.
# NIBBLE_SERVE_ARGS="--chunk 512").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
streams="1 2 4 8 16" p=256 n=64 rounds=2 threads=0 config="$root/bench/configs/tinyllama-1.1b.json"
busy="8" busy_p=32 probes=8 spare=1 llama_src="${LLAMA_CPP_SOURCE_DIR:-}" only=""
while getopts "s:p:n:r:t:c:b:B:q:S:L:e:" o; do
  case "$o" in
    s) streams="$OPTARG" ;; p) p="$OPTARG" ;; n) n="$OPTARG" ;; r) rounds="$OPTARG" ;; t) threads="$OPTARG" ;;
    c) config="$OPTARG" ;; b) busy="$OPTARG" ;; B) busy_p="$OPTARG" ;; q) probes="$OPTARG" ;; L) llama_src="$OPTARG" ;;
    e) only="$OPTARG" ;; S) spare="$OPTARG" ;;
    *) echo "usage: $0 [-s STREAMS] [-p N] [-n N] [-r ROUNDS] [-t THREADS] [-c CONFIG] [-b BUSY] [-B BUSY_P] [-q PROBES] [-S SPARE]" \
         "[-L LLAMA_CPP_SOURCE_DIR] [-e ENGINE] [WORK_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
nibble="$root/build/release/nibble"
[[ -x "$nibble" ]] || { echo "serve.sh: build the CLI first ($nibble not found)" >&2; exit 1; }
[[ -f "$config" ]] || { echo "serve.sh: -c $config: no such file" >&2; exit 2; }
engines="nibble"
if [[ -n "$llama_src" ]]; then
  [[ -f "$llama_src/CMakeLists.txt" ]] ||
    { echo "serve.sh: $llama_src: no CMakeLists.txt (expected a llama.cpp source tree)" >&2; exit 2; }
  llama_src="$(cd "$llama_src" && pwd)"
  work="${1:-$root/build/vs_llamacpp}"
  mkdir -p "$work" && work="$(cd "$work" && pwd)"
  # shellcheck source=bench/llamacpp.sh
  source "$root/bench/llamacpp.sh"
  echo "building llama.cpp (llama-server) in $work/llama.cpp-build ..." >&2
  llamacpp_build "$llama_src" "$work" llama-server llama-quantize llama-convert-llama2c-to-ggml
  llamacpp_same_weights "$nibble" "$config" "$work"
  llama_server="$(llamacpp_bin llama-server)"
  model="$work/nibble-q" gguf="$work/q4_0.gguf" engines="nibble llama.cpp"
else
  work="${1:-$root/build/bench_serve}"
  mkdir -p "$work"
  model="$work/$(basename "$config" .json)-quark"
  [[ -f "$model/config.json" ]] || "$nibble" synth --config "$config" --out "$model" --format quark >&2
fi
if [[ -n "$only" ]]; then
  [[ " $engines " == *" $only "* ]] || { echo "serve.sh: -e $only: expected one of: $engines" >&2; exit 2; }
  engines="$only"
fi
nthreads=$threads
((nthreads > 0)) || nthreads=$(nproc)

read -r -a nibble_args <<<"${NIBBLE_SERVE_ARGS:-}"
read -r -a llama_args <<<"${LLAMA_SERVER_ARGS:-}"
pid=""
# Quietly: llama-server b4748 aborts in its exit path after SIGTERM, which bash would report.
stop_server() {
  [[ -n "$pid" ]] || return 0
  kill "$pid" || true
  for _ in $(seq 100); do kill -0 "$pid" || break; sleep 0.1; done
  kill -9 "$pid" || true
  wait "$pid" || true
  pid=""
} 2>/dev/null
trap stop_server EXIT

# start_server ENGINE SLOTS CTX: starts it on loopback and sets `port` once it answers.
start_server() {
  local engine="$1" slots="$2" ctx="$3" log="$work/serve-$1.log"
  port=""
  if [[ "$engine" == nibble ]]; then
    "$nibble" serve --model "$model" --port 0 --parallel "$slots" --ctx_size "$ctx" --threads "$threads" \
      "${nibble_args[@]}" 2>"$log" &
    pid=$!
    for _ in $(seq 1200); do
      port="$(grep -o 'ready on port [0-9]*' "$log" | grep -o '[0-9]*$' || true)"
      [[ -n "$port" ]] && return 0
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  else
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    "$llama_server" -m "$gguf" --host 127.0.0.1 --port "$port" -np "$slots" -c $((slots * ctx)) -t "$nthreads" \
      "${llama_args[@]}" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1200); do
      python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$port/health" 2>/dev/null && return 0
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  echo "serve.sh: $engine did not start (log: $log)" >&2
  tail -20 "$log" >&2
  exit 1
}

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
echo "host: $cpu; nibble $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?');" \
  "$( [[ -n "$llama_src" ]] && echo "llama.cpp $llama_src ($(git -C "$llama_src" rev-parse --short HEAD 2>/dev/null || echo 'not a git tree'))")"
echo "weights: $(basename "$config") ($model$( [[ -n "$llama_src" ]] && echo ", $gguf")); threads $nthreads"

if [[ -n "$streams" ]]; then
  echo "burst: prompt $p tokens, $n generated, $rounds rounds; server slots = streams"
  res="$work/serve-burst.jsonl"
  : >"$res"
  for s in $streams; do
    for e in $engines; do
      start_server "$e" "$s" $((p + n + 16))
      node "$root/bench/serve_bench.cjs" "$e" "http://127.0.0.1:$port" "$s" "$p" "$n" "$rounds" |
        python3 -c 'import json,sys; j=json.load(sys.stdin); j["engine"]=sys.argv[1]; j["load"]=open("/proc/loadavg").read().split()[0]; print(json.dumps(j))' "$e" >>"$res"
      stop_server
    done
  done
  python3 - "$res" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["engine"], r["streams"]): r for r in rows}
engines = [e for e in ("nibble", "llama.cpp") if any(r["engine"] == e for r in rows)]
hdr = f"{'streams':>7}"
for e in engines:
    hdr += f" {e + ' tok/s':>15} {'x1':>5} {'TTFT p50/p99 ms':>17}"
if len(engines) == 2:
    hdr += f" {'tok/s ratio':>11} {'p99 ratio':>9}"
print(hdr + "  load")
for s in sorted({r["streams"] for r in rows}):
    line, loads = f"{s:>7}", []
    for e in engines:
        r, one = by[(e, s)], by.get((e, 1))
        x1 = r["decode_tok_s"] / one["decode_tok_s"] if one else float("nan")
        line += f" {r['decode_tok_s']:>15.1f} {x1:>5.2f} {r['ttft_ms_p50']:>8.0f}/{r['ttft_ms_p99']:<8.0f}"
        loads.append(r["load"])
    if len(engines) == 2:
        n_, l_ = by[("nibble", s)], by[("llama.cpp", s)]
        line += f" {n_['decode_tok_s'] / l_['decode_tok_s']:>10.2f}x {n_['ttft_ms_p99'] / l_['ttft_ms_p99']:>8.2f}x"
    print(line + "  " + "/".join(loads))
EOF
fi

if [[ -n "$busy" ]]; then
  echo "steady: probe prompt $p tokens; busy streams: $busy_p-token prompts, $n tokens each, request after request;" \
    "$probes probes idle, then $probes busy; server slots = busy + $spare"
  res="$work/serve-steady.jsonl"
  : >"$res"
  for b in $busy; do
    for e in $engines; do
      start_server "$e" $((b + spare)) $(( (p > busy_p ? p : busy_p) + n + 16 ))
      node "$root/bench/serve_bench.cjs" "$e" "http://127.0.0.1:$port" steady "$b" "$busy_p" "$n" "$p" "$probes" |
        python3 -c 'import json,sys; j=json.load(sys.stdin); j["engine"]=sys.argv[1]; j["load"]=open("/proc/loadavg").read().split()[0]; print(json.dumps(j))' "$e" >>"$res"
      stop_server
    done
  done
  python3 - "$res" <<'EOF'
import json, sys
print(f"{'engine':<10} {'busy':>4} {'idle TTFT p50/p99 ms':>21} {'busy TTFT p50/p99 ms':>21} {'p50 x':>6} {'p99 x':>6}"
      f" {'busy decode tok/s':>17} {'load':>5}")
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"{r['engine']:<10} {r['busy_streams']:>4} {r['idle_ttft_ms_p50']:>10.0f}/{r['idle_ttft_ms_p99']:<10.0f}"
          f" {r['busy_ttft_ms_p50']:>10.0f}/{r['busy_ttft_ms_p99']:<10.0f} {r['ratio_p50']:>6.2f} {r['ratio_p99']:>6.2f}"
          f" {r['busy_decode_tok_s']:>17.1f} {r['load']:>5}")
EOF
fi
