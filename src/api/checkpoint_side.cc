#include "api/checkpoint_side.h"

#include "formats/float_dtype.h"
#include "model/llama.h"
#include "model/model_loader.h"
#include "model/weights.h"

namespace nibble {

Result<CheckpointSide> OpenCheckpointSide(const std::string& dir) {
  CheckpointSide s;
  NIBBLE_ASSIGN_OR_RETURN(s.format, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(s.config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(s.store, TensorStore::OpenDir(dir));
  NIBBLE_RETURN_IF_ERROR(CheckCheckpointShapes(s.config, s.store, s.format.get()));
  NIBBLE_ASSIGN_OR_RETURN(s.proj, FindOutputProjection(s.config, s.store));
  s.linears = LinearModuleNames(s.config, true);
  // A tied model's stored lm_head tensors are not part of the model (every engine ignores them).
  if (s.proj.tied)
    for (const std::string& n : s.store.Names())
      if (n.starts_with("lm_head.")) s.linear_tensors.insert(n);
  for (const std::string& m : s.linears) {
    if (m == "lm_head" && s.proj.tied) continue;
    s.linear_tensors.insert(m + ".weight");
    if (!s.format) continue;
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, s.format->Resolve(m));
    if (!plan.spec) continue;
    for (const std::string& suffix : s.format->TensorSuffixes())
      if (suffix != "bias") s.linear_tensors.insert(m + "." + suffix);
  }
  return s;
}

Result<std::optional<Int4Matrix>> LinearInt4(const CheckpointSide& s, const std::string& module) {
  if (!s.format || (module == "lm_head" && s.proj.tied)) return std::optional<Int4Matrix>{};
  const auto [n, k] = LinearShape(s.config, module);
  NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, s.format->Resolve(module));
  return s.format->Import(s.store, module, plan, n, k);
}

Result<const TensorView*> FloatLinearTensor(const CheckpointSide& s, const std::string& module, std::string* how) {
  const auto [n, k] = LinearShape(s.config, module);
  const bool tied = module == "lm_head" && s.proj.tied;
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(s.store, tied ? kEmbedTokensWeight : module + ".weight", {n, k}));
  *how = std::string("float ") + DTypeName(t->dtype) + (tied ? std::string(" (tied: ") + kEmbedTokensWeight + ")" : "");
  return t;
}

Result<std::vector<float>> LinearWeight(const CheckpointSide& s, const std::string& module, std::string* how) {
  NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> q, LinearInt4(s, module));
  if (q) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, s.format->Resolve(module));
    *how = DescribeSpec(*plan.spec) + (q->g_idx.empty() ? "" : " g_idx");
    std::vector<float> w(static_cast<size_t>(q->n * q->k));
    DequantizeRef(*q, w.data());
    return w;
  }
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, FloatLinearTensor(s, module, how));
  return TensorToF32(*t);
}

}  // namespace nibble
