#include "model/config.h"

#include "io/file.h"
#include "io/json.h"

namespace nibble {

using nlohmann::json;

namespace {

struct Reader {
  const json& j;
  const std::string& path;

  Error Bad(const std::string& key, const std::string& expected, const json& found) const {
    return MakeError(path, ": key \"", key, "\": expected ", expected, ", found ", found.dump());
  }
  // Required positive integer, at most kMaxConfigSize.
  Result<int64_t> PosInt(const std::string& key) const {
    auto it = j.find(key);
    if (it == j.end()) return MakeError(path, ": missing required key \"", key, "\" (a positive integer)");
    if (!it->is_number_integer()) return Bad(key, "a positive integer", *it);
    if (it->is_number_unsigned() ? it->get<uint64_t>() > uint64_t{kMaxConfigSize} : it->get<int64_t>() > kMaxConfigSize)
      return Bad(key, "a positive integer up to " + std::to_string(kMaxConfigSize), *it);
    const int64_t v = it->get<int64_t>();
    if (v <= 0) return Bad(key, "a positive integer", *it);
    return v;
  }
  Result<int64_t> OptPosInt(const std::string& key, int64_t def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    return PosInt(key);
  }
  Result<double> OptPosNumber(const std::string& key, double def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_number() || it->get<double>() <= 0) return Bad(key, "a positive number", *it);
    return it->get<double>();
  }
  Result<bool> OptBool(const std::string& key, bool def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) return Bad(key, "true or false", *it);
    return it->get<bool>();
  }
};

Result<RopeScaling> ParseRopeScaling(const json& j, const std::string& path) {
  RopeScaling rs;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return rs;
  if (!it->is_object()) return MakeError(path, ": key \"rope_scaling\": expected null or an object, found ", it->dump());
  std::string type;
  if (it->contains("rope_type") && (*it)["rope_type"].is_string()) type = (*it)["rope_type"];
  else if (it->contains("type") && (*it)["type"].is_string()) type = (*it)["type"];
  if (type == "default") return rs;
  Reader r{*it, path};
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    NIBBLE_ASSIGN_OR_RETURN(rs.factor, r.OptPosNumber("factor", 1.0));
    return rs;
  }
  if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    NIBBLE_ASSIGN_OR_RETURN(rs.factor, r.OptPosNumber("factor", 8.0));
    NIBBLE_ASSIGN_OR_RETURN(rs.low_freq_factor, r.OptPosNumber("low_freq_factor", 1.0));
    NIBBLE_ASSIGN_OR_RETURN(rs.high_freq_factor, r.OptPosNumber("high_freq_factor", 4.0));
    NIBBLE_ASSIGN_OR_RETURN(rs.original_max_position_embeddings, r.OptPosInt("original_max_position_embeddings", 8192));
    if (rs.high_freq_factor <= rs.low_freq_factor)
      return MakeError(path, ": rope_scaling: high_freq_factor (", rs.high_freq_factor, ") must be larger than low_freq_factor (", rs.low_freq_factor, ")");
    return rs;
  }
  return MakeErrorCode(ErrorCode::kUnsupported, path, ": key \"rope_scaling\": unsupported rope type \"", type, "\" (supported: none, linear, llama3)");
}

// Mistral: sliding_window (null = none) on every layer. Qwen2 / Qwen3 record a sliding_window
// but use it only with use_sliding_window true, and then only on the layers from
// max_window_layers on: that per-layer mix is refused by name rather than run wrong.
Status ParseSlidingWindow(const json& j, const std::string& path, ModelConfig* c) {
  Reader r{j, path};
  const bool qwen = c->model_type == "qwen2" || c->model_type == "qwen3";
  bool use_sw = !qwen;
  auto use = j.find("use_sliding_window");
  if (use != j.end() && !use->is_null()) {
    if (!use->is_boolean()) return r.Bad("use_sliding_window", "true or false", *use);
    use_sw = use->get<bool>();
  }
  auto sw = j.find("sliding_window");
  if (sw == j.end() || sw->is_null() || !use_sw) return Status::Ok();
  if (!sw->is_number_integer() || sw->get<int64_t>() <= 0) return r.Bad("sliding_window", "null or a positive integer", *sw);
  if (qwen)
    return MakeErrorCode(ErrorCode::kUnsupported, path, ": key \"use_sliding_window\": true is not supported for ",
                         c->model_type, " (a window on the layers from max_window_layers on); set it false");
  c->sliding_window = sw->get<int64_t>();
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const json& j, const std::string& path) {
  if (!j.is_object()) return MakeError(path, ": expected a JSON object, found ", j.type_name());
  ModelConfig c;
  c.path = path;
  Reader r{j, path};
  auto arch = j.find("architectures");
  if (arch != j.end() && !arch->is_null()) {
    if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string())
      return r.Bad("architectures", "a list of architecture names", *arch);
    c.architecture = (*arch)[0].get<std::string>();
  }
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return MakeError(path, ": missing or non-string key \"model_type\"");
  c.model_type = mt->get<std::string>();
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2" && c.model_type != "qwen3")
    return MakeErrorCode(ErrorCode::kUnsupported, path, ": model_type \"", c.model_type, "\" is not supported (supported: llama, mistral, qwen2, qwen3)");
  if (!c.architecture.empty() && c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM" &&
      c.architecture != "Qwen2ForCausalLM" && c.architecture != "Qwen3ForCausalLM")
    return MakeErrorCode(ErrorCode::kUnsupported, path, ": architecture \"", c.architecture, "\" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
  c.qk_norm = c.model_type == "qwen3";

  NIBBLE_ASSIGN_OR_RETURN(c.hidden_size, r.PosInt("hidden_size"));
  NIBBLE_ASSIGN_OR_RETURN(c.intermediate_size, r.PosInt("intermediate_size"));
  NIBBLE_ASSIGN_OR_RETURN(c.num_hidden_layers, r.PosInt("num_hidden_layers"));
  NIBBLE_ASSIGN_OR_RETURN(c.num_attention_heads, r.PosInt("num_attention_heads"));
  NIBBLE_ASSIGN_OR_RETURN(c.num_key_value_heads, r.OptPosInt("num_key_value_heads", c.num_attention_heads));
  NIBBLE_ASSIGN_OR_RETURN(c.vocab_size, r.PosInt("vocab_size"));
  NIBBLE_ASSIGN_OR_RETURN(c.max_position_embeddings, r.OptPosInt("max_position_embeddings", 2048));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return MakeError(path, ": num_attention_heads (", c.num_attention_heads, ") is not divisible by num_key_value_heads (", c.num_key_value_heads, ")");
  auto hd = j.find("head_dim");
  if (hd != j.end() && !hd->is_null()) {
    NIBBLE_ASSIGN_OR_RETURN(c.head_dim, r.PosInt("head_dim"));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      return MakeError(path, ": hidden_size (", c.hidden_size, ") is not divisible by num_attention_heads (", c.num_attention_heads, ") and no head_dim is given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return MakeError(path, ": head_dim ", c.head_dim, " must be even for rotary embeddings");
  NIBBLE_ASSIGN_OR_RETURN(c.rms_norm_eps, r.OptPosNumber("rms_norm_eps", 1e-6));
  NIBBLE_ASSIGN_OR_RETURN(c.rope_theta, r.OptPosNumber("rope_theta", 10000.0));
  NIBBLE_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, path));
  NIBBLE_ASSIGN_OR_RETURN(bool attention_bias, r.OptBool("attention_bias", false));
  c.qkv_bias = attention_bias || c.model_type == "qwen2";
  c.o_bias = attention_bias && c.model_type != "qwen2";
  NIBBLE_ASSIGN_OR_RETURN(c.mlp_bias, r.OptBool("mlp_bias", false));
  NIBBLE_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.OptBool("tie_word_embeddings", false));
  auto act = j.find("hidden_act");
  if (act != j.end() && !act->is_null() && (!act->is_string() || act->get<std::string>() != "silu"))
    return r.Bad("hidden_act", "\"silu\"", *act);
  NIBBLE_RETURN_IF_ERROR(ParseSlidingWindow(j, path, &c));
  auto bos = j.find("bos_token_id");
  if (bos != j.end() && !bos->is_null()) {
    if (!bos->is_number_integer() || bos->get<int64_t>() < 0 || bos->get<int64_t>() >= c.vocab_size)
      return r.Bad("bos_token_id", "a token id in [0, vocab_size)", *bos);
    c.bos_token_id = bos->get<int64_t>();
  }
  auto eos = j.find("eos_token_id");
  if (eos != j.end() && !eos->is_null()) {
    std::vector<json> ids = eos->is_array() ? eos->get<std::vector<json>>() : std::vector<json>{*eos};
    for (const json& e : ids) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.vocab_size)
        return r.Bad("eos_token_id", "a token id (or list of ids) in [0, vocab_size)", *eos);
      c.eos_token_ids.push_back(e.get<int64_t>());
    }
  }
  auto dt = j.find("torch_dtype");
  if (dt != j.end() && dt->is_string()) c.torch_dtype = dt->get<std::string>();
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& dir) {
  NIBBLE_RETURN_IF_ERROR(CheckModelDir(dir));
  std::string path = JoinPath(dir, "config.json");
  NIBBLE_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  return ParseModelConfig(j, path);
}

}  // namespace nibble
