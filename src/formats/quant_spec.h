// What every checkpoint format resolves one linear layer to: the format-neutral description of
// its 4-bit weight quantization. Format modules translate their own config (Quark's
// QuantizationSpec, compressed-tensors' config_groups, AutoAWQ's / GPTQ's quantize_config) into
// it; RTN, the calibration algorithms, the model loader and the exporters read only this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "io/safetensors.h"

namespace nibble {

/// How round-to-nearest derives a group's scale and zero point (SPEC §4): each producer has its
/// own rule, and an export must use its target's rule to match that tool bit for bit.
enum class RtnFlavour {
  kQuark,  // SPEC §4.1: range through 0; uint4 s = (max − min) / 15, int4 s = amax / 7.5
};

/// How RTN rounds x / s (Quark's round_method); only kHalfEven is implemented.
enum class Rounding { kHalfEven, kRound, kFloor };
const char* RoundingName(Rounding r);  // "half_even" | "round" | "floor"

/// Groups along K, or one scale per output row (per-channel; formats store the two differently).
enum class Granularity { kPerGroup, kPerChannel };

struct QuantSpec {
  int bits = 4;
  Granularity granularity = Granularity::kPerGroup;
  int64_t group_size = 128;  // along K; −1 = the whole row (always −1 for kPerChannel)
  bool symmetric = false;    // int4 codes −8..7 (native zero point 8) vs uint4 0..15 with zero points
  /// The dtype scales are stored (and rounded) in; nullopt = the weight's own dtype.
  std::optional<DType> scale_dtype;
  RtnFlavour rtn = RtnFlavour::kQuark;
  Rounding rounding = Rounding::kHalfEven;
  /// The checkpoint carries a permutation of K (GPTQ act-order g_idx that is not the natural one).
  bool act_order = false;

  /// Group size along K for a row of length `k`: k when group_size == −1.
  int64_t EffectiveGroupSize(int64_t k) const { return group_size == -1 ? k : group_size; }
  bool operator==(const QuantSpec&) const = default;
};

/// Short text for messages and inspect: "uint4 per_group g128", "int4 per_group g=K",
/// "uint4 per_channel".
std::string DescribeSpec(const QuantSpec& spec);

}  // namespace nibble
