// config.json -> ModelConfig for the Llama family (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM): the variants that differ only in config and in Qwen3's
// per-head q/k RMSNorms. Field names follow HF config.json.
//
// Sliding-window attention: Mistral's `sliding_window` applies to every layer (each query attends
// to the last sliding_window keys, itself included). Qwen2/Qwen3's per-layer windows
// (use_sliding_window true with max_window_layers) are refused by name. Non-goal: rope_scaling
// types other than linear / llama3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace nibble {

/// HF `rope_scaling` (None, {"rope_type"|"type": "linear", "factor"}, or llama3 with
/// factor / low_freq_factor / high_freq_factor / original_max_position_embeddings).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

/// The largest value ParseModelConfig accepts for a size (hidden_size, num_hidden_layers,
/// vocab_size, max_position_embeddings, ...): token ids and positions are int32, and products of
/// two sizes must not overflow. Sizes are checked against the tensors by CheckCheckpointShapes.
constexpr int64_t kMaxConfigSize = 2147483647;

/// The architecture numbers of a Llama-family decoder, as in HF config.json.
struct ModelConfig {
  std::string path;          // the config.json it was parsed from, for messages
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // "llama" | "mistral" | "qwen2" | "qwen3"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // config "head_dim" or hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  // Llama attention_bias, or always for Qwen2
  bool o_bias = false;    // Llama attention_bias only
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  bool qk_norm = false;        // Qwen3: RMSNorm q_norm / k_norm [head_dim] on each head before RoPE
  int64_t sliding_window = 0;  // 0 = none; else keys (p - sliding_window, p] for a query at p
  int64_t bos_token_id = -1;   // -1 = not set
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype;  // "float32" | "float16" | "bfloat16" | "" when absent
};

/// Parses a parsed config.json object. `path` names the file in errors. Errors: unsupported
/// architecture / model_type, missing or wrong-typed required keys, zero / negative sizes or sizes
/// above kMaxConfigSize,
/// num_attention_heads % num_key_value_heads != 0, hidden_size not divisible by heads when
/// head_dim is absent, unsupported rope_scaling, hidden_act other than silu.
Result<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& path);

/// Reads and parses `dir/config.json` (after io/file.h CheckModelDir).
Result<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace nibble
