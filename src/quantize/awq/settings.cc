#include "quantize/awq/settings.h"

namespace nibble {

std::vector<AwqMapping> DefaultLlamaScalingLayers() {
  return {{"input_layernorm", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, "self_attn.q_proj", "self_attn"},
          {"self_attn.v_proj", {"self_attn.o_proj"}, "self_attn.o_proj", ""},
          {"post_attention_layernorm", {"mlp.gate_proj", "mlp.up_proj"}, "mlp.gate_proj", "mlp"},
          {"mlp.up_proj", {"mlp.down_proj"}, "mlp.down_proj", ""}};
}

Result<DuoScaling> ParseDuoScaling(const std::string& text, const std::string& what) {
  if (text == "true") return DuoScaling::kTrue;
  if (text == "false") return DuoScaling::kFalse;
  if (text == "both") return DuoScaling::kBoth;
  return MakeErrorCode(ErrorCode::kUnsupported, what, " \"", text, "\" is not supported (supported: true, false, both)");
}

const char* DuoScalingName(DuoScaling d) {
  switch (d) {
    case DuoScaling::kTrue: return "true";
    case DuoScaling::kFalse: return "false";
    default: return "both";
  }
}

Status ValidateAwqSettings(const AwqSettings& s, const AwqSettingNames& names) {
  if (s.n_grid < 2 || (s.duo_scaling == DuoScaling::kBoth && s.n_grid < 4))
    return MakeError(names.n_grid, " ", s.n_grid, " is too small (at least 2; 4 with ", names.duo_scaling, " both)");
  return Status::Ok();
}

namespace {

// One scaling_layers entry; `w` names it in errors.
Result<AwqMapping> ParseMapping(const nlohmann::ordered_json& m, const std::string& w) {
  if (!m.is_object()) return MakeError(w, ": expected an object");
  if (!m.contains("prev_op") || !m["prev_op"].is_string()) return MakeError(w, ".prev_op: expected a string");
  AwqMapping mp;
  mp.prev_op = m["prev_op"].get<std::string>();
  if (!m.contains("layers") || !m["layers"].is_array() || m["layers"].empty())
    return MakeError(w, ".layers: expected a non-empty list of strings");
  for (const auto& l : m["layers"]) {
    if (!l.is_string()) return MakeError(w, ".layers: expected a non-empty list of strings");
    mp.layers.push_back(l.get<std::string>());
  }
  if (m.contains("inp") && !m["inp"].is_null()) {
    if (!m["inp"].is_string()) return MakeError(w, ".inp: expected a string");
    mp.inp = m["inp"].get<std::string>();
  }
  if (m.contains("module2inspect") && !m["module2inspect"].is_null()) {
    if (!m["module2inspect"].is_string()) return MakeError(w, ".module2inspect: expected a string or null");
    mp.module2inspect = m["module2inspect"].get<std::string>();
  }
  return mp;
}

// The optional settings keys of an "awq" entry (`where` names it) onto s.
Status ParseSettingKeys(const nlohmann::ordered_json& j, const std::string& where, AwqSettings& s, AwqSettingNames& names) {
  if (j.contains("duo_scaling")) {
    const auto& d = j["duo_scaling"];
    if (d.is_boolean()) s.duo_scaling = d.get<bool>() ? DuoScaling::kTrue : DuoScaling::kFalse;
    else if (d.is_string() && d == "both") s.duo_scaling = DuoScaling::kBoth;
    else if (d.is_string() && (d == "true" || d == "false")) s.duo_scaling = d == "true" ? DuoScaling::kTrue : DuoScaling::kFalse;
    else return MakeError(where, ".duo_scaling: expected true, false or \"both\"");
    names.duo_scaling = where + ".duo_scaling";
  }
  if (j.contains("n_grid")) {
    if (!j["n_grid"].is_number_integer()) return MakeError(where, ".n_grid: expected an integer, found ", j["n_grid"].dump());
    s.n_grid = j["n_grid"].get<int64_t>();
    names.n_grid = where + ".n_grid";
  }
  if (j.contains("clip")) {
    if (!j["clip"].is_boolean()) return MakeError(where, ".clip: expected a boolean");
    s.clip = j["clip"].get<bool>();
  }
  if (j.contains("propagation")) {
    if (j["propagation"] == "fp") s.propagation = Propagation::kFp;
    else if (j["propagation"] == "quantized") s.propagation = Propagation::kQuantized;
    else return MakeError(where, ".propagation: expected \"fp\" or \"quantized\"");
  }
  return Status::Ok();
}

}  // namespace

Status ApplyAwqAlgoConfig(const nlohmann::ordered_json& j, const std::string& where, AwqSettings& s,
                          AwqSettingNames& names) {
  if (j.contains("scaling_layers") && !j["scaling_layers"].is_null()) {
    if (!j["scaling_layers"].is_array()) return MakeError(where, ".scaling_layers: expected a list");
    s.scaling_layers.clear();
    for (size_t i = 0; i < j["scaling_layers"].size(); ++i) {
      NIBBLE_ASSIGN_OR_RETURN(AwqMapping mp, ParseMapping(j["scaling_layers"][i], where + ".scaling_layers[" + std::to_string(i) + "]"));
      s.scaling_layers.push_back(std::move(mp));
    }
  }
  return ParseSettingKeys(j, where, s, names);
}

nlohmann::ordered_json AwqAlgoConfigJson(const AwqSettings& s, const std::vector<AwqMapping>& used, const ModelConfig& mc) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& m : used) {
    nlohmann::ordered_json e;
    e["prev_op"] = m.prev_op;
    e["layers"] = m.layers;
    e["inp"] = m.inp.empty() ? m.layers[0] : m.inp;
    if (!m.module2inspect.empty()) e["module2inspect"] = m.module2inspect;
    layers.push_back(e);
  }
  nlohmann::ordered_json a;
  a["name"] = "awq";
  a["scaling_layers"] = layers;
  a["model_decoder_layers"] = "model.layers";
  a["num_attention_heads"] = mc.num_attention_heads;
  a["num_key_value_heads"] = mc.num_key_value_heads;
  if (s.duo_scaling == DuoScaling::kBoth) a["duo_scaling"] = "both";
  else a["duo_scaling"] = s.duo_scaling == DuoScaling::kTrue;
  a["n_grid"] = s.n_grid;
  a["clip"] = s.clip;
  a["propagation"] = s.propagation == Propagation::kFp ? "fp" : "quantized";
  return nlohmann::ordered_json::array({a});
}

}  // namespace nibble
