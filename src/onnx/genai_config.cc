#include "onnx/genai_config.h"

namespace nibble {

namespace {

// generation_config.json's value of `key`, else config.json's, else `fallback`.
nlohmann::json Setting(const nlohmann::json& gen, const nlohmann::json& cfg, const char* key, nlohmann::json fallback) {
  for (const nlohmann::json* j : {&gen, &cfg})
    if (j->is_object() && j->contains(key) && !(*j)[key].is_null()) return (*j)[key];
  return fallback;
}

}  // namespace

nlohmann::ordered_json GenaiConfig(const ModelConfig& c, const nlohmann::json& config_json,
                                   const nlohmann::json& generation_config) {
  const nlohmann::json& g = generation_config;
  nlohmann::json eos = Setting(g, config_json, "eos_token_id", nlohmann::json(2));
  nlohmann::json pad = Setting(g, config_json, "pad_token_id", eos.is_array() && !eos.empty() ? eos[0] : eos);
  nlohmann::ordered_json decoder = {
      {"session_options", {{"log_id", "onnxruntime-genai"}, {"provider_options", nlohmann::json::array()}}},
      {"filename", "model.onnx"},
      {"head_size", c.head_dim},
      {"hidden_size", c.hidden_size},
      {"inputs",
       {{"input_ids", "input_ids"},
        {"attention_mask", "attention_mask"},
        {"past_key_names", "past_key_values.%d.key"},
        {"past_value_names", "past_key_values.%d.value"}}},
      {"outputs",
       {{"logits", "logits"}, {"present_key_names", "present.%d.key"}, {"present_value_names", "present.%d.value"}}},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_key_value_heads", c.num_key_value_heads}};
  nlohmann::ordered_json model = {{"bos_token_id", Setting(g, config_json, "bos_token_id", nlohmann::json(1))},
                                  {"context_length", c.max_position_embeddings},
                                  {"decoder", decoder},
                                  {"eos_token_id", eos},
                                  {"pad_token_id", pad},
                                  {"type", c.model_type},
                                  {"vocab_size", c.vocab_size}};
  nlohmann::ordered_json search = {
      {"diversity_penalty", 0.0},
      {"do_sample", Setting(g, nlohmann::json::object(), "do_sample", false)},
      {"early_stopping", true},
      {"length_penalty", 1.0},
      {"max_length", c.max_position_embeddings},
      {"min_length", 0},
      {"no_repeat_ngram_size", 0},
      {"num_beams", 1},
      {"num_return_sequences", 1},
      // GroupQueryAttention updates the KV cache in place in buffers of max_length.
      {"past_present_share_buffer", true},
      {"repetition_penalty", Setting(g, nlohmann::json::object(), "repetition_penalty", 1.0)},
      {"temperature", Setting(g, nlohmann::json::object(), "temperature", 1.0)},
      {"top_k", Setting(g, nlohmann::json::object(), "top_k", 50)},
      {"top_p", Setting(g, nlohmann::json::object(), "top_p", 1.0)}};
  return {{"model", model}, {"search", search}};
}

}  // namespace nibble
