// GPTQ (SPEC §3.1) and AWQ followed by GPTQ as LayerAlgorithms of the sequential pipeline
// (quantize/pipeline.h).
//
// Per decoder layer, after the pipeline's fp pass: one Hessian H = 2/rows · XᵀX per distinct
// linear input (q/k/v share the attention input, gate/up the MLP input), factorised once
// (gptq/solver.h) and used by every quantized linear it feeds; the layer's codes are GPTQ's. By
// default every H comes from that fp pass (llm-compressor); true_sequential re-runs the layer
// with the linears before each input already quantized (GPTQModel). AWQ+GPTQ is the chain of the
// two (AlgorithmChain): AWQ's smoothing in Transform and its clip search (if on) before GPTQ,
// which then quantizes the smoothed weights. One layer's Hessians are in memory at a time.
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
#include "quantize/awq/awq.h"
#include "quantize/calib_result.h"
#include "quantize/gptq/settings.h"
#include "quantize/gptq/solver.h"
#include "quantize/pipeline.h"

namespace nibble {

using GptqLayerReport = CalibLayerResult;
using GptqResult = CalibResult;

class GptqAlgorithm final : public LayerAlgorithm {
 public:
  /// Errors: invalid settings.
  static Result<std::unique_ptr<GptqAlgorithm>> Create(const GptqSettings& settings);

  /// One per distinct linear input.
  int64_t StepsPerLayer() const override { return 4; }
  Status Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                const std::function<Status()>& step) override;
  std::vector<std::string> Messages() const override;

  const std::vector<std::array<GptqLinearInfo, kNumLinears>>& infos() const { return infos_; }
  int64_t hessian_peak_bytes() const { return peak_bytes_; }

 private:
  explicit GptqAlgorithm(const GptqSettings& s) : st_(s) {}
  // Quantizes the linears fed by `in` (their inputs x: `rows` rows) into codes.
  Status QuantizeInput(LayerInput in, const float* x, int64_t rows, const CalibLayer& L, LayerCodes& codes,
                       std::array<GptqLinearInfo, kNumLinears>& info);

  GptqSettings st_;
  std::vector<std::array<GptqLinearInfo, kNumLinears>> infos_;
  std::set<std::string> messages_;
  int64_t peak_bytes_ = 0;
};

/// Runs GPTQ, after AWQ when `awq` is given (RunCalibrated), with settings.propagation.
Result<GptqResult> RunGptq(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                           const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len, const GptqSettings& settings,
                           const std::optional<AwqSettings>& awq, const LayerTensorSink& sink,
                           const std::function<void(int64_t, int64_t)>& progress,
                           const CancellationToken* cancel = nullptr);

}  // namespace nibble
