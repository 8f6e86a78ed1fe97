// AMD Quark hf_format as a registry entry (formats/checkpoint_format.h): config resolution with
// Quark's semantics (formats/quark_config.h), tensors through formats/quark_pack.h, and the
// translation between Quark's QuantizationSpec and the neutral QuantSpec.
#pragma once

#include <memory>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "formats/quant_spec.h"
#include "formats/quark_config.h"

namespace nibble {

/// Quark's spec in neutral terms. Errors: (dtype, symmetric) not (int4, true) / (uint4, false).
Result<QuantSpec> QuantSpecFromQuark(const WeightQuantSpec& spec);
/// The Quark spec whose tensor layout (qscheme, group_size, int4 / uint4) holds `spec`.
WeightQuantSpec QuarkSpecFor(const QuantSpec& spec);
/// ResolveLayer (Quark semantics) into the neutral plan.
Result<LinearPlan> ResolveQuarkLinear(const QuarkQuantConfig& config, const std::string& module);

/// The Quark format of an already parsed config (quantize's own requests, tests).
std::unique_ptr<QuantizedFormat> MakeQuarkFormat(QuarkQuantConfig config);

/// The registry entry ("quark", --model_export hf_format).
const FormatEntry& QuarkFormatEntry();

}  // namespace nibble
