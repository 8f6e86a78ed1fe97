// What a calibrated run (AWQ, GPTQ, or a chain of them) reports: one type for every algorithm,
// per decoder layer the AWQ mappings, the per-linear output errors and what GPTQ did per linear.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "quantize/awq/search.h"
#include "quantize/awq/settings.h"
#include "quantize/pipeline.h"

namespace nibble {

/// What GPTQ did for one linear.
struct GptqLinearInfo {
  bool ran = false;              // quantized by GPTQ (false: kept in float, or GPTQ not in the run)
  double dampening_frac = 0;     // the fraction that factorised
  int retries = 0;               // failed factorisations before it
  int64_t dead_columns = 0;      // inputs with H[j][j] == 0
  bool fallback_rtn = false;     // nothing factorised: plain RTN
};

struct CalibLayerResult {
  int64_t layer = 0;
  std::vector<AwqMappingReport> mappings;  // AWQ in the run only
  std::vector<LinearErrorReport> linears;  // rtn_error / method_error (the algorithm's weights)
  std::array<GptqLinearInfo, kNumLinears> gptq{};
  double seconds = 0;
};

struct CalibResult {
  std::vector<CalibLayerResult> layers;
  std::vector<std::string> messages;  // skipped AWQ mappings, GPTQ retries and singular Hessians
  std::vector<AwqMapping> awq_used;   // AWQ: mappings applied in at least one layer
  int64_t hessian_peak_bytes = 0;     // GPTQ: the largest one Hessian and its factorisation took
  double seconds = 0;
};

}  // namespace nibble
