#include "model/model_loader.h"

#include "model/config.h"
#include "model/int4_linear.h"
#include "model/weights.h"

namespace nibble {

LinearLoader MakeLinearLoader(std::shared_ptr<const QuantizedFormat> format) {
  if (format == nullptr) return LoadDenseLinear;
  return [format](const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                  bool has_bias) -> Result<std::unique_ptr<Linear>> {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(prefix));
    NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> m, format->Import(store, prefix, plan, n, k));
    if (!m) return LoadDenseLinear(store, prefix, n, k, has_bias);
    std::vector<float> bias;
    if (has_bias) {
      NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
    }
    return std::unique_ptr<Linear>(new Int4Linear(std::move(*m), std::move(bias), DescribeSpec(*plan.spec)));
  };
}

namespace {

// A float tensor of `shape` (any float dtype), as the loader will read it.
Status CheckFloat(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(store, name, shape));
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16)
    return MakeErrorCode(ErrorCode::kCorruptInput, t->file, ": tensor \"", name, "\" has dtype ", DTypeName(t->dtype),
                         ", expected a floating-point dtype (F32, F16 or BF16)");
  return Status::Ok();
}

bool HasBias(const ModelConfig& c, const std::string& module) {
  if (module == "lm_head") return false;
  const bool qkv = module.ends_with("q_proj") || module.ends_with("k_proj") || module.ends_with("v_proj");
  return qkv ? c.qkv_bias : module.ends_with("o_proj") ? c.o_bias : c.mlp_bias;
}

}  // namespace

Status CheckCheckpointShapes(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format) {
  const int64_t h = c.hidden_size;
  // A tied model may omit lm_head; an untied one must have it.
  const bool has_lm_head = store.Find("lm_head.weight") != nullptr || !c.tie_word_embeddings;
  NIBBLE_RETURN_IF_ERROR(CheckFloat(store, "model.embed_tokens.weight", {c.vocab_size, h}));
  NIBBLE_RETURN_IF_ERROR(CheckFloat(store, "model.norm.weight", {h}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "input_layernorm.weight", {h}));
    NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "post_attention_layernorm.weight", {h}));
  }
  for (const std::string& module : LinearModuleNames(c, has_lm_head)) {
    const auto [n, k] = LinearShape(c, module);
    if (HasBias(c, module)) NIBBLE_RETURN_IF_ERROR(CheckFloat(store, module + ".bias", {n}));
    if (format == nullptr) {
      NIBBLE_RETURN_IF_ERROR(CheckFloat(store, module + ".weight", {n, k}));
      continue;
    }
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(module));
    NIBBLE_RETURN_IF_ERROR(format->CheckLinear(store, module, plan, n, k));
  }
  return Status::Ok();
}

Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, std::string* format_name) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> format, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  if (format_name != nullptr) *format_name = format ? format->name() : "dense";
  return LlamaModel::FromStore(config, store, MakeLinearLoader(std::move(format)));
}

}  // namespace nibble
