#include "formats/quant_spec.h"

namespace nibble {

const char* RoundingName(Rounding r) {
  switch (r) {
    case Rounding::kHalfEven: return "half_even";
    case Rounding::kRound: return "round";
    default: return "floor";
  }
}

std::string DescribeSpec(const QuantSpec& spec) {
  std::string s = spec.symmetric ? "int4" : "uint4";
  if (spec.granularity == Granularity::kPerChannel) return s + " per_channel";
  return s + " per_group" + (spec.group_size == -1 ? " g=K" : " g" + std::to_string(spec.group_size));
}

}  // namespace nibble
