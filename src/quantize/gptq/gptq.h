// GPTQ (SPEC §3.1) as a ChainAlgorithm of the sequential pipeline (quantize/pipeline.h) and its
// entry in the algorithm registry (quantize/algorithm.h).
//
// Per decoder layer, after the pipeline's fp pass: one Hessian H = 2/rows · XᵀX per distinct
// linear input (q/k/v share the attention input, gate/up the MLP input), factorised once
// (gptq/solver.h) and used by every quantized linear it feeds; the layer's codes are GPTQ's. By
// default every H comes from that fp pass (llm-compressor); true_sequential re-runs the layer
// with the linears before each input already quantized (GPTQModel). In the chain awq,gptq, AWQ's
// smoothing (Transform) and its clip search (if on) run before GPTQ, which then quantizes the
// smoothed weights. One layer's Hessians are in memory at a time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/quark_config.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quantize/algorithm.h"
#include "quantize/calib_result.h"
#include "quantize/gptq/settings.h"
#include "quantize/gptq/solver.h"
#include "quantize/pipeline.h"

namespace nibble {

class GptqAlgorithm final : public ChainAlgorithm {
 public:
  /// `settings` valid (ValidateGptqSettings).
  explicit GptqAlgorithm(const GptqSettings& settings) : st_(settings) {}

  /// One per distinct linear input.
  int64_t StepsPerLayer() const override { return 4; }
  Status Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                const std::function<Status()>& step) override;
  std::vector<std::string> Messages() const override;
  bool NeedsGrams() const override { return true; }
  /// Without true_sequential GPTQ needs only each input's XᵀX.
  Status FinishGrams(LayerGrams& grams, const CalibLayer& layer, LayerCodes& codes,
                     const std::function<Status()>& step) override;
  /// CalibLayerResult::gptq, and the largest Hessian as CalibResult::hessian_peak_bytes.
  void ReportLayer(size_t i, CalibLayerResult& out) const override { out.gptq = infos_[i]; }
  void ReportRun(CalibResult& out) const override { out.hessian_peak_bytes = peak_bytes_; }
  nlohmann::ordered_json SaveState() const override;
  Status LoadState(const nlohmann::ordered_json& state) override;

 private:
  // Quantizes the linears fed by `in` (their inputs x: `rows` rows) into codes.
  Status QuantizeInput(LayerInput in, const float* x, int64_t rows, const CalibLayer& L, LayerCodes& codes,
                       std::array<GptqLinearInfo, kNumLinears>& info);
  // The same from g = XᵀX (consumed; becomes the Hessian and its factor).
  Status QuantizeGram(LayerInput in, std::vector<float> g, int64_t rows, const CalibLayer& L, LayerCodes& codes,
                      std::array<GptqLinearInfo, kNumLinears>& info);
  // H = 2/rows · g factorised as L's calibration dtype says. Changes no member: FinishGrams runs
  // it on a thread of its own.
  Result<GptqFactor> FactorInput(LayerInput in, std::vector<float> g, int64_t rows, const CalibLayer& L) const;
  // The linears fed by `in` quantized with its factor f (its error, if any, returned named), the
  // run's messages and Hessian peak updated.
  Status QuantizeWithFactor(LayerInput in, Result<GptqFactor> f, int64_t rows, const CalibLayer& L, LayerCodes& codes,
                            std::array<GptqLinearInfo, kNumLinears>& info);

  GptqSettings st_;
  std::vector<std::array<GptqLinearInfo, kNumLinears>> infos_;
  std::set<std::string> messages_;
  int64_t peak_bytes_ = 0;
};

/// The registry's GPTQ (QuantAlgorithm::resolve): the flags' settings with `propagation`, the
/// "gptq" algo_config entry (`entry`, nullptr when none; `where` names it) over them, validated.
Result<std::shared_ptr<const AlgorithmSettings>> ResolveGptq(const AlgorithmFlags& flags, Propagation propagation,
                                                             const nlohmann::ordered_json* entry, const std::string& where);
/// GPTQ not in `chain` (QuantAlgorithm::check_unused): --actorder is refused, the other flags
/// validated.
Status CheckGptqFlagsUnused(const AlgorithmFlags& flags, const std::string& chain);

}  // namespace nibble
