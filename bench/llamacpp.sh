# shellcheck shell=bash
# Shared by the benchmarks against llama.cpp (bench/vs_llamacpp.sh, bench/serve.sh); sourced, not run.
#
# llamacpp_build SRC WORK TARGET...: configures llama.cpp from the source tree SRC in
#   WORK/llama.cpp-build (never in SRC or in this repository) and builds only TARGETs, incrementally;
#   sets LLAMACPP_BUILD. The server is configured in (LLAMA_BUILD_SERVER=ON) so that one build
#   directory serves both scripts; only the targets named are compiled.
# llamacpp_bin NAME: the path of a built program.
# llamacpp_same_weights NIBBLE CONFIG WORK: one random-weight checkpoint of CONFIG's shapes
#   (`nibble synth --format dense --llama2c`) converted for both engines: WORK/q4_0.gguf
#   (llama-convert-llama2c-to-ggml, then llama-quantize Q4_0, its default recipe: output.weight
#   Q6_K) and WORK/nibble-q (`nibble quantize`: Quark uint4 g128 RTN, lm_head included). Kept and
#   reused while WORK/weights.config is CONFIG (another config redoes them). Needs the build of
#   llama-quantize and llama-convert-llama2c-to-ggml.

llamacpp_build() {
  local src="$1" work="$2"
  shift 2
  LLAMACPP_BUILD="$work/llama.cpp-build"
  cmake -S "$src" -B "$LLAMACPP_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON >"$work/llama.cpp-cmake.log" 2>&1 ||
    { echo "error: configuring llama.cpp failed (log: $work/llama.cpp-cmake.log)" >&2; return 1; }
  cmake --build "$LLAMACPP_BUILD" -j "$(nproc)" --target "$@" >"$work/llama.cpp-build.log" 2>&1 ||
    { echo "error: building llama.cpp ($*) failed (log: $work/llama.cpp-build.log)" >&2; return 1; }
}

llamacpp_bin() {
  local p
  p="$(find "$LLAMACPP_BUILD" -type f -name "$1" -perm -u+x | head -1)"
  [ -n "$p" ] || { echo "error: $1 not found under $LLAMACPP_BUILD" >&2; return 1; }
  echo "$p"
}

llamacpp_same_weights() {
  local nibble="$1" config="$2" work="$3" convert quantize
  if [ -f "$work/q4_0.gguf" ] && [ -d "$work/nibble-q" ] && cmp -s "$config" "$work/weights.config"; then
    return 0
  fi
  convert="$(llamacpp_bin llama-convert-llama2c-to-ggml)" && quantize="$(llamacpp_bin llama-quantize)" || return 1
  rm -rf "$work/q4_0.gguf" "$work/nibble-q" "$work/weights.config"
  "$nibble" synth --config "$config" --format dense --llama2c --out "$work/dense" --overwrite >/dev/null
  "$convert" --copy-vocab-from-model "$work/dense/tokenizer.llama2c.bin" \
    --llama2c-model "$work/dense/model.llama2c.bin" --llama2c-output-model "$work/f32.gguf" >"$work/convert.log" 2>&1 ||
    { echo "error: llama-convert-llama2c-to-ggml failed on $config (log: $work/convert.log). Its fp32 model must fit" \
        "one 2 GiB ggml context in some llama.cpp versions (about 500M parameters): pass a smaller config with -c" \
        "(bench/configs/tinyllama-6l.json)" >&2
      return 1; }
  "$quantize" "$work/f32.gguf" "$work/q4_0.gguf" Q4_0 >"$work/quantize.log" 2>&1 ||
    { echo "error: llama-quantize failed (log: $work/quantize.log)" >&2; return 1; }
  rm -f "$work/f32.gguf"
  "$nibble" quantize --model_dir "$work/dense" --output_dir "$work/nibble-q" --quant_scheme w_uint4_per_group_asym \
    --group_size 128 --exclude_layers '' >/dev/null
  rm -rf "$work/dense"
  cp "$config" "$work/weights.config"
}
