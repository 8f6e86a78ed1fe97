// A llama2.c checkpoint of a dense Llama checkpoint, for running the same weights in llama.cpp
// (its convert-llama2c-to-ggml reads this layout; bench/vs_llamacpp.sh drives it).
//
// model file (little-endian, version-0 layout): int32 dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size (negative: lm_head stored separately), seq_len; then fp32 arrays, each
// row-major in the HF [out_features, in_features] order, layers stacked: token embeddings [V, D],
// input norms [L, D], q [L, D, D], k [L, KV, D], v [L, KV, D], o [L, D, D], post-attention norms
// [L, D], gate [L, F, D], down [L, D, F], up [L, F, D], final norm [D], the legacy RoPE tables
// (seq_len × head_dim floats, zeros: readers skip them), lm_head [V, D] when untied.
// vocab file (llama2.c tokenizer.bin): uint32 max piece length, then per id: fp32 score,
// uint32 length, the piece's bytes (U+2581 written as a space, as llama2.c's exporter does).
#pragma once

#include <string>

#include <nibble/error.h>

namespace nibble {

/// Writes `dense_dir` (config.json + float safetensors of a LlamaForCausalLM with head_dim ·
/// heads = hidden, no biases, no rope_scaling) to `model_path`, and its tokenizer.model's pieces
/// (ids past the tokenizer's vocabulary as "<extra_N>", score 0) padded to vocab_size to
/// `vocab_path`. Both are written beside their final name and renamed when complete. Errors: the
/// config keys llama2.c cannot express (named, with the value), a missing or non-float tensor,
/// an unreadable tokenizer.model, write failures (the file named).
Status WriteLlama2c(const std::string& dense_dir, const std::string& model_path, const std::string& vocab_path);

}  // namespace nibble
