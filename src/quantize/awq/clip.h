// AutoAWQ's weight-clipping search (SPEC §2.3) on Quark RTN: per output row and group, the
// max |w| shrink factor (1 − i/20, i < 10) that minimises the group's output error on up to 512
// sampled calibration rows; the weights are clamped to the best range.
#pragma once

#include <cstdint>

#include "base/result.h"
#include "quantize/pipeline.h"

namespace nibble {

/// Clips linear `slot` of L (which must be quantized) given its inputs x [rows, K].
Status ClipLinear(CalibLayer& L, int slot, const float* x, int64_t rows);

}  // namespace nibble
