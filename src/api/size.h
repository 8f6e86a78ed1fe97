// SizeSummary (<nibble/quantize.h>) of a freshly quantized checkpoint and of an inspected one.
#pragma once

#include <cstdint>
#include <vector>

#include <nibble/quantize.h>

namespace nibble {

/// From quantize's per-linear bytes: bytes_in (float input) and bytes_out (as written).
SizeSummary SizeOfQuantized(const std::vector<QuantizeSummary::Layer>& layers, int64_t tensor_bytes);

/// From inspect's per-linear stored bytes, with float linears of `float_bits` each.
SizeSummary SizeOfInspected(const std::vector<InspectReport::Layer>& layers, int64_t tensor_bytes, int float_bits);

}  // namespace nibble
