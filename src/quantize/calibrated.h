// A calibrated run: the plan's chain of algorithms (quantize/algorithm.h) as one AlgorithmChain
// on the sequential pipeline (quantize/pipeline.h), reported in one CalibResult whatever the
// chain.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nibble/cancel.h>
#include <nlohmann/json.hpp>

#include "base/result.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quantize/algorithm.h"
#include "quantize/calib_result.h"
#include "quantize/pipeline.h"

namespace nibble {

/// A resumable run's layer boundaries (quantize/resume.h). Resuming: `start_layer` > 0, `state`
/// (a boundary's: the pipeline's layer reports and each algorithm's SaveState) and the saved
/// activations `input` of dtype `input_dtype`. `on_boundary` receives each new boundary.
struct CalibCheckpoint {
  int64_t start_layer = 0;
  nlohmann::ordered_json state;
  std::vector<uint8_t> input;
  std::string input_dtype;
  std::function<Status(int64_t layer, const nlohmann::ordered_json& state, std::span<const uint8_t> input,
                       const std::string& dtype)>
      on_boundary;
};

/// Runs the algorithms of `algorithms` in chain order on every decoder layer through
/// RunLayerPipeline (see there for the inputs and the sink) with the chain's propagation, and
/// assembles the report from each algorithm's; `on_stage` as PipelineOptions::on_stage.
/// Errors: every pipeline error.
Result<CalibResult> RunCalibrated(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                  const AlgorithmPlan& algorithms, const std::vector<int32_t>& tokens, int64_t batch,
                                  int64_t seq_len, const LayerTensorSink& sink,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  const CancellationToken* cancel,
                                  const std::function<void(int64_t layer, const char* stage)>& on_stage = {},
                                  CalibCheckpoint* checkpoint = nullptr);

}  // namespace nibble
