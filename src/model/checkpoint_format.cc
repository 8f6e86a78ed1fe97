#include "model/checkpoint_format.h"

#include <cstring>

#include "formats/quark_pack.h"
#include "io/file.h"
#include "io/json.h"
#include "model/int4_linear.h"
#include "model/weights.h"

namespace nibble {

std::string DescribeSpec(const WeightQuantSpec& spec) {
  std::string s = std::string(QuantDTypeName(spec.dtype)) + " " + QSchemeName(spec.qscheme);
  if (spec.qscheme == QScheme::kPerGroup) s += spec.group_size == -1 ? " g=K" : " g" + std::to_string(spec.group_size);
  return s;
}

Result<CheckpointInfo> DetectCheckpointFormat(const std::string& dir) {
  NIBBLE_RETURN_IF_ERROR(CheckModelDir(dir));
  const std::string path = JoinPath(dir, "config.json");
  NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, path));
  CheckpointInfo info;
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return info;
  const auto& qc = j["quantization_config"];
  if (!qc.is_object()) return MakeError(path, ": key \"quantization_config\": expected an object, found ", qc.type_name());
  const std::string method = qc.contains("quant_method") && qc["quant_method"].is_string() ? qc["quant_method"].get<std::string>() : "";
  if (method != "quark")
    return MakeError(path, ": quantization_config.quant_method \"", method,
                     "\" is not supported (supported: \"quark\", AMD Quark hf_format)");
  NIBBLE_ASSIGN_OR_RETURN(QuarkQuantConfig cfg, ParseQuarkQuantConfigFromConfigJson(text, path));
  info.format = CheckpointFormat::kQuark;
  info.quark = std::move(cfg);
  return info;
}

LinearLoader MakeQuarkLinearLoader(const QuarkQuantConfig& config) {
  return [config](const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                  bool has_bias) -> Result<std::unique_ptr<Linear>> {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(config, prefix));
    const TensorView* w = store.Find(prefix + ".weight");
    const bool float_weight = w != nullptr && (w->dtype == DType::kF32 || w->dtype == DType::kF16 || w->dtype == DType::kBF16);
    if (!r.spec) {
      if (w != nullptr && !float_weight)
        return MakeError(store.description(), ": module ", prefix, " is not quantized by the config (", r.rule,
                         ") but its weight is stored as ", DTypeName(w->dtype), " ", w->ShapeString(),
                         "; expected a float weight of shape [", n, ", ", k, "]");
      if (store.Find(prefix + ".weight_scale") != nullptr)
        return MakeError(store.description(), ": module ", prefix, " is not quantized by the config (", r.rule,
                         ") but has a weight_scale tensor");
      return LoadDenseLinear(store, prefix, n, k, has_bias);
    }
    if (config.export_config.weight_format == WeightFormat::kFakeQuantized) {
      // fake_quantized: the QDQ'd float weight is stored; run it dense (SPEC §1.4).
      return LoadDenseLinear(store, prefix, n, k, has_bias);
    }
    if (float_weight)
      return MakeError(store.description(), ": module ", prefix, " is quantized by the config (", r.rule, ": ",
                       DescribeSpec(*r.spec), ") but its weight is stored as float ", DTypeName(w->dtype), " ",
                       w->ShapeString(), "; expected packed int32");
    NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, ImportQuarkLinear(store, prefix, *r.spec, config.export_config.pack_method, n, k));
    std::vector<float> bias;
    if (has_bias) {
      NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
    }
    return std::unique_ptr<Linear>(new Int4Linear(std::move(m), std::move(bias), DescribeSpec(*r.spec)));
  };
}

Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, CheckpointInfo* info_out) {
  NIBBLE_ASSIGN_OR_RETURN(CheckpointInfo info, DetectCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  LinearLoader loader = info.format == CheckpointFormat::kQuark ? MakeQuarkLinearLoader(*info.quark) : LinearLoader(LoadDenseLinear);
  auto model = LlamaModel::FromStore(config, store, loader);
  if (info_out != nullptr) *info_out = std::move(info);
  return model;
}

std::pair<int64_t, int64_t> LinearShape(const ModelConfig& c, const std::string& name) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  auto ends = [&](const char* s) { return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0; };
  if (name == "lm_head") return {c.vocab_size, h};
  if (ends("q_proj")) return {q, h};
  if (ends("k_proj") || ends("v_proj")) return {kv, h};
  if (ends("o_proj")) return {h, q};
  if (ends("gate_proj") || ends("up_proj")) return {c.intermediate_size, h};
  if (ends("down_proj")) return {h, c.intermediate_size};
  return {0, 0};
}

std::vector<std::string> LinearModuleNames(const ModelConfig& c, bool has_lm_head) {
  std::vector<std::string> names;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const auto& n : DecoderLinearNames()) names.push_back("model.layers." + std::to_string(l) + "." + n);
  if (has_lm_head) names.push_back("lm_head");
  return names;
}

}  // namespace nibble
