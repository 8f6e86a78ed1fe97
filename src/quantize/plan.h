// The quantize plan: a request resolved once, for one model, into the algorithms that run (their
// registry entries and settings, quantize/algorithm.h) and what happens to every linear module
// (its spec, or float, and the rule that decided). The calibrated pipeline, the export writer
// (ExportRequest::plans and the algo_config), the tensor-parallel check, the report and the
// model card read it; nothing downstream resolves the Quark config or the algorithm names again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "formats/engines.h"
#include "formats/quant_spec.h"
#include "formats/quark_config.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/output_projection.h"
#include "quantize/algorithm.h"

namespace nibble {

/// What to do with a layer whose in_features K is not a multiple of its group_size.
enum class MisalignedPolicy {
  kError,       // refuse, naming the layer, K and g (what vLLM does at load)
  kExclude,     // keep the layer in float; its name is added to `exclude`
  kPerChannel,  // quantize it per-channel; a layer_quant_config entry for its name is added first
};

/// One linear module of the model as the plan decides it.
struct PlannedLinear {
  std::string module;  // HF module name ("model.layers.0.mlp.down_proj", "lm_head")
  std::string weight;  // the input tensor its weight is read from (a tied lm_head: the embedding)
  int64_t n = 0, k = 0;
  std::optional<QuantSpec> spec;  // nullopt: kept in float
  std::string rule;               // what decided, as the report states it
  /// False for a tied lm_head kept in float: the embedding serves it and no module is written.
  bool written = true;
};

struct QuantizePlan {
  /// The request after the --misaligned policy's additions (and the writer's scale dtype): what
  /// the written quantization_config is made from.
  QuarkQuantConfig config;
  /// The --quant_algo chain with each algorithm's settings (ResolveAlgorithms).
  AlgorithmPlan algorithms;
  std::vector<PlannedLinear> linears;  // model order, lm_head last
  /// A tied model whose lm_head is quantized: quantized from the embedding, written untied.
  bool head_from_embedding = false;

  /// The entry of `module`, or nullptr.
  const PlannedLinear* Find(const std::string& module) const;
  /// The modules the export writes, in order (a tied lm_head kept in float is not one).
  std::vector<std::string> WrittenModules() const;
  std::vector<LinearShapeInfo> WrittenShapes() const;
  /// The specs of the written modules in WrittenModules order (ExportRequest::plans).
  std::vector<LinearPlan> WrittenPlans() const;
  /// Every quantized spec's scales stored in `dt` (the config too): a writer's ScaleDType.
  void SetScaleDType(DType dt);
};

/// Resolves `config` for the dense checkpoint (mc, store) whose output projection is `proj`:
/// each linear's spec with Quark semantics (SPEC §1.3), the misaligned-K policy applied; the
/// plan holds `algorithms` (resolved before the model is read, so their errors come first).
/// Errors: a non-2-D weight, a misaligned layer under kError (naming it, K, g and the rule),
/// a config rule that does not resolve, and no linear quantized at all (naming the reasons).
Result<QuantizePlan> MakeQuantizePlan(const QuarkQuantConfig& config, AlgorithmPlan algorithms, MisalignedPolicy policy,
                                      const ModelConfig& mc, const TensorStore& store, const OutputProjection& proj);

/// "model.layers.12." of a decoder layer's tensor or module name, else "".
std::string LayerPrefix(const std::string& name);

}  // namespace nibble
