// AWQ (activation-aware weight quantization) with llm-compressor AWQModifier semantics (SPEC §2.1)
// and Quark `scaling_layers` mappings (SPEC §1.2), as a LayerAlgorithm of the sequential
// pipeline (quantize/pipeline.h); AutoAWQ's clipping search (SPEC §2.3) as an option.
//
// Per decoder layer: for each mapping, the layer is run (with its current, already smoothed
// weights) as far as the mapping needs, its grid is searched and the best scales applied
// (awq/search.h); after the pipeline's fp pass, the optional clip search runs on the smoothed
// weights (q/k skipped). The pipeline then applies RTN to the smoothed weights (unrounded, as the
// reference implementation does; folded norm weights are already rounded to their dtype).
// Non-goals: MoE / fused qkv models, offloading, GELU-style activations between prev_op and layers.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/quark_config.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quantize/awq/mappings.h"
#include "quantize/awq/search.h"
#include "quantize/awq/settings.h"
#include "quantize/calib_result.h"
#include "quantize/pipeline.h"

namespace nibble {

using AwqLayerReport = CalibLayerResult;
using AwqResult = CalibResult;

class AwqAlgorithm final : public LayerAlgorithm {
 public:
  /// Errors: a mapping that does not resolve (names it), a grid that is too small.
  static Result<std::unique_ptr<AwqAlgorithm>> Create(const AwqSettings& settings);

  int64_t StepsPerLayer() const override { return static_cast<int64_t>(maps_.size()); }
  Status Transform(LayerRunner& runner, CalibLayer& layer, const std::function<Status()>& step) override;
  Status Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                const std::function<Status()>& step) override;
  std::vector<std::string> Messages() const override { return {messages_.begin(), messages_.end()}; }

  /// Per layer, in order, the mapping reports of every Transform so far.
  const std::vector<std::vector<AwqMappingReport>>& mapping_reports() const { return reports_; }
  /// The mappings applied in at least one layer, in settings order.
  std::vector<AwqMapping> Used() const;

 private:
  explicit AwqAlgorithm(const AwqSettings& s) : st_(s) {}
  // Why mapping r cannot run in L ("" when it can).
  std::string SkipReason(const ModelConfig& c, const ResolvedMapping& r, const CalibLayer& L) const;

  AwqSettings st_;
  std::vector<ResolvedMapping> maps_;
  std::vector<std::vector<AwqMappingReport>> reports_;
  std::set<std::string> used_, messages_;
};

/// Runs AWQ alone (RunCalibrated) with settings.propagation.
Result<AwqResult> RunAwq(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                         const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len, const AwqSettings& settings,
                         const LayerTensorSink& sink, const std::function<void(int64_t, int64_t)>& progress,
                         const CancellationToken* cancel = nullptr);

}  // namespace nibble
