// AWQ (activation-aware weight quantization) with llm-compressor AWQModifier semantics (SPEC §2.1)
// and Quark `scaling_layers` mappings (SPEC §1.2), as a ChainAlgorithm of the sequential pipeline
// (quantize/pipeline.h) and its entry in the algorithm registry (quantize/algorithm.h); AutoAWQ's
// clipping search (SPEC §2.3) as an option.
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
#include "quantize/algorithm.h"
#include "quantize/awq/mappings.h"
#include "quantize/awq/search.h"
#include "quantize/awq/settings.h"
#include "quantize/calib_result.h"
#include "quantize/pipeline.h"

namespace nibble {

class AwqAlgorithm final : public ChainAlgorithm {
 public:
  /// `settings` valid (ValidateAwqSettings), `maps` its scaling_layers resolved.
  AwqAlgorithm(const AwqSettings& settings, std::vector<ResolvedMapping> maps) : st_(settings), maps_(std::move(maps)) {}

  int64_t StepsPerLayer() const override { return static_cast<int64_t>(maps_.size()); }
  Status Transform(LayerRunner& runner, CalibLayer& layer, const std::function<Status()>& step) override;
  Status Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                const std::function<Status()>& step) override;
  bool Transforms() const override { return true; }
  /// Nothing after the fp pass without the clip search (its searches read only
  /// LayerRunner::Capture); the clip search needs the activations.
  Status FinishGrams(LayerGrams&, const CalibLayer&, LayerCodes&, const std::function<Status()>&) override;
  std::vector<std::string> Messages() const override { return {messages_.begin(), messages_.end()}; }
  /// CalibLayerResult::mappings, and the mappings applied in at least one layer as
  /// CalibResult::awq_used.
  void ReportLayer(size_t i, CalibLayerResult& out) const override { out.mappings = reports_[i]; }
  void ReportRun(CalibResult& out) const override { out.awq_used = Used(); }
  nlohmann::ordered_json SaveState() const override;
  Status LoadState(const nlohmann::ordered_json& state) override;

  /// The mappings applied in at least one layer, in settings order.
  std::vector<AwqMapping> Used() const;

 private:
  // Why mapping r cannot run in L ("" when it can).
  std::string SkipReason(const ModelConfig& c, const ResolvedMapping& r, const CalibLayer& L) const;

  AwqSettings st_;
  std::vector<ResolvedMapping> maps_;
  std::vector<std::vector<AwqMappingReport>> reports_;
  std::set<std::string> used_, messages_;
};

/// The registry's AWQ (QuantAlgorithm::resolve): the flags' settings with `propagation`, the
/// "awq" algo_config entry (`entry`, nullptr when none; `where` names it) over them, validated, its scaling_layers resolved (a mapping that does
/// not resolve is named).
Result<std::shared_ptr<const AlgorithmSettings>> ResolveAwq(const AlgorithmFlags& flags, Propagation propagation,
                                                            const nlohmann::ordered_json* entry, const std::string& where);
/// AWQ not in `chain` (QuantAlgorithm::check_unused): its flags validated.
Status CheckAwqFlagsUnused(const AlgorithmFlags& flags, const std::string& chain);

}  // namespace nibble
