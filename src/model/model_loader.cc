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

Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, std::string* format_name) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> format, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  if (format_name != nullptr) *format_name = format ? format->name() : "dense";
  return LlamaModel::FromStore(config, store, MakeLinearLoader(std::move(format)));
}

}  // namespace nibble
