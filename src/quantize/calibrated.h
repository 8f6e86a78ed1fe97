// A calibrated run: AWQ, GPTQ or AWQ then GPTQ as one AlgorithmChain on the sequential pipeline
// (quantize/pipeline.h), reported in one CalibResult whatever the chain.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <nibble/cancel.h>

#include "base/result.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quantize/awq/settings.h"
#include "quantize/calib_result.h"
#include "quantize/gptq/settings.h"
#include "quantize/pipeline.h"

namespace nibble {

/// Runs AWQ (when `awq` is given), then GPTQ (when `gptq` is given), on every decoder layer
/// through RunLayerPipeline (see there for the inputs and the sink) with `propagation`, and
/// assembles the report. Errors: invalid settings, every pipeline error.
Result<CalibResult> RunCalibrated(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                  const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len,
                                  const std::optional<AwqSettings>& awq, const std::optional<GptqSettings>& gptq,
                                  Propagation propagation, const LayerTensorSink& sink,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  const CancellationToken* cancel);

}  // namespace nibble
