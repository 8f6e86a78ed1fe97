#!/usr/bin/env bash
# Builds the libFuzzer targets in the `asan` preset's build (clang, ASan + UBSan; the libraries
# there are the ones the ASan tests use, so scripts/test.sh compiles them once for both) and runs
# each one: first over its seed corpus in fuzz/corpus/<target>/ (regression), then fuzzing for
# FUZZ_SECONDS (default 60) seconds. A crash, leak, sanitizer report or an input running over
# 10 s (a hang) fails the script; the reproducer is left in build/asan/fuzz-crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
targets=(safetensors_header quant_config checkpoint_roundtrip tokenizer_json tokenizer_encode tokenizer_config chat_template serve_request)
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$(nproc)" --target "${targets[@]/%/_fuzz}"
mkdir -p build/asan/fuzz-crashes
for t in "${targets[@]}"; do
  exe="build/asan/${t}_fuzz"
  echo "== fuzz $t: seed corpus"
  "$exe" -runs=0 "fuzz/corpus/$t" 2>&1 | tail -n 1
  work="build/asan/fuzz-corpus-$t"
  mkdir -p "$work"
  echo "== fuzz $t: ${seconds}s"
  "$exe" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 -artifact_prefix="build/asan/fuzz-crashes/$t-" \
    "$work" "fuzz/corpus/$t" 2>&1 | grep -E "stat::number_of_executed_units|ERROR|SUMMARY" || true
  if ls "build/asan/fuzz-crashes/$t-"* >/dev/null 2>&1; then
    echo "fuzz $t: crash reproducer(s) in build/asan/fuzz-crashes/" >&2
    exit 1
  fi
done
