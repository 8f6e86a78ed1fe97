#include "model/model_loader.h"

#include <set>

#include "model/config.h"
#include "model/int4_linear.h"
#include "model/output_projection.h"
#include "model/weights.h"

namespace nibble {

LinearLoader MakeLinearLoader(std::shared_ptr<const QuantizedFormat> format,
                              std::shared_ptr<std::atomic<int64_t>> act_order) {
  if (format == nullptr) return LoadDenseLinear;
  return [format, act_order](const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                  bool has_bias) -> Result<std::unique_ptr<Linear>> {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(prefix));
    NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> m, format->Import(store, prefix, plan, n, k));
    if (!m) return LoadDenseLinear(store, prefix, n, k, has_bias);
    std::vector<float> bias;
    if (has_bias) {
      NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
    }
    // Readers keep a g_idx only when it is not the natural one.
    const std::string desc = DescribeSpec(*plan.spec) + (m->g_idx.empty() ? "" : " act-order");
    if (act_order && !m->g_idx.empty()) ++*act_order;
    return std::unique_ptr<Linear>(new Int4Linear(std::move(*m), std::move(bias), desc));
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
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(c, store));
  NIBBLE_RETURN_IF_ERROR(CheckFloat(store, "model.embed_tokens.weight", {c.vocab_size, h}));
  NIBBLE_RETURN_IF_ERROR(CheckFloat(store, "model.norm.weight", {h}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "input_layernorm.weight", {h}));
    NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "post_attention_layernorm.weight", {h}));
    if (c.qk_norm) {
      NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "self_attn.q_norm.weight", {c.head_dim}));
      NIBBLE_RETURN_IF_ERROR(CheckFloat(store, p + "self_attn.k_norm.weight", {c.head_dim}));
    }
  }
  for (const std::string& module : LinearModuleNames(c, proj.ReadsHeadModule())) {
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

Result<std::string> CheckUnreadTensors(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format) {
  std::set<std::string> known = {"model.embed_tokens.weight", "model.norm.weight"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    known.insert({p + "input_layernorm.weight", p + "post_attention_layernorm.weight"});
    if (c.qk_norm) known.insert({p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"});
  }
  const std::vector<std::string> suffixes = format ? format->TensorSuffixes() : std::vector<std::string>{"weight"};
  const std::vector<std::string> modules = LinearModuleNames(c, true);
  for (const std::string& m : modules) {
    known.insert(m + ".bias");
    for (const std::string& s : suffixes) known.insert(m + "." + s);
  }
  std::vector<std::string> unread;
  for (const std::string& name : store.Names()) {
    if (known.count(name) != 0) continue;
    for (const std::string& m : modules) {
      if (format == nullptr || !name.starts_with(m + ".")) continue;
      NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(m));
      if (!plan.spec) continue;
      std::string expected;
      for (const std::string& s : suffixes) expected += (expected.empty() ? "" : ", ") + s;
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", name, " of quantized module ", m,
                           " is not one nibble reads (", format->name(), " module tensors: ", expected,
                           ", bias); it may change how the module is meant to be decoded");
    }
    unread.push_back(name);
  }
  if (unread.empty()) return std::string();
  std::string list;
  for (size_t i = 0; i < unread.size() && i < 8; ++i) list += (i ? ", " : "") + unread[i];
  if (unread.size() > 8) list += ", ... (" + std::to_string(unread.size() - 8) + " more)";
  return std::to_string(unread.size()) + (unread.size() == 1 ? " tensor" : " tensors") +
         " in the checkpoint not read by nibble: " + list;
}

Status CheckTiedLmHead(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format,
                       std::vector<std::string>* warnings) {
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(c, store));
  if (!proj.tied) return Status::Ok();
  if (format != nullptr && !proj.head_stored) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve("lm_head"));
    if (plan.spec)
      return MakeErrorCode(ErrorCode::kCorruptInput, "config.json declares lm_head quantized (", plan.rule, ": ",
                           DescribeSpec(*plan.spec), ") but the checkpoint has no lm_head tensor (tie_word_embeddings "
                           "is true: the output projection is the float embedding); exclude lm_head in the config");
  }
  if (proj.stored_head_ignored) warnings->push_back(proj.IgnoredHeadWarning());
  return Status::Ok();
}

Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, std::string* format_name,
                                                 std::vector<std::string>* warnings) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> format, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  if (format_name != nullptr) *format_name = format ? format->name() : "dense";
  std::vector<std::string> notes;
  NIBBLE_ASSIGN_OR_RETURN(std::string unread, CheckUnreadTensors(config, store, format.get()));
  if (!unread.empty()) notes.push_back(unread);
  NIBBLE_RETURN_IF_ERROR(CheckTiedLmHead(config, store, format.get(), &notes));
  auto act_order = std::make_shared<std::atomic<int64_t>>(0);
  auto m = LlamaModel::FromStore(config, store, MakeLinearLoader(std::move(format), act_order));
  if (*act_order > 0)
    notes.push_back("note: " + std::to_string(act_order->load()) + " int4 linears have an act-order g_idx: their columns are "
                    "sorted by group once at load and each input gathered to match (the kernels see natural groups)");
  if (m.ok() && warnings != nullptr) warnings->insert(warnings->end(), notes.begin(), notes.end());
  return m;
}

}  // namespace nibble
