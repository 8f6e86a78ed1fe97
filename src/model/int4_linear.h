// Int4 linear: weights in the native int4 layout (formats/int4_matrix.h), fp32 activations
// (W4A32 numerics: activations are never quantized).
//
// Kernels: M = 1 (decode) runs the W4A32 GEMV kernel directly on the codes; M > 1 (prefill,
// perplexity) dequantizes the weight once per call into a scratch fp32 matrix and runs the dense
// GEMM, which is exact w.r.t. the same dequantized weights and amortises the dequantization over
// M rows. Fast per-ISA int4 kernels replace both paths behind this class without changing it.
#pragma once

#include <string>
#include <vector>

#include "formats/int4_matrix.h"
#include "model/linear.h"

namespace nibble {

class Int4Linear final : public Linear {
 public:
  /// `desc` describes the stored scheme for inspect (e.g. "uint4 per_group g128").
  /// bias: empty or [N].
  Int4Linear(Int4Matrix weight, std::vector<float> bias, std::string desc);
  int64_t in_features() const override { return w_.k; }
  int64_t out_features() const override { return w_.n; }
  void Forward(const float* x, int64_t m, float* y) const override;
  std::string Describe() const override { return desc_; }
  /// Packed size: 0.5 B per weight + per group one scale (4 B) and one zero point (0.5 B).
  int64_t WeightBytes() const override;
  const Int4Matrix& weight() const { return w_; }

 private:
  Int4Matrix w_;
  std::vector<float> bias_;
  std::string desc_;
};

}  // namespace nibble
