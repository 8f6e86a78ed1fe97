// exp(x) in fp32 as a branch-free polynomial, the one exponential of softmax, SiLU and
// log-softmax (model/ops.h, eval/, the vectorised row ops of kernels/vec_ops.h).
#pragma once

#include <cstdint>

namespace nibble {

/// exp(x) in fp32 without branches or calls, so loops over it vectorise: Cody-Waite range
/// reduction x = n·ln2 + r, a degree-6 polynomial for e^r on |r| <= ln2/2, then 2^n through the
/// exponent bits. Max relative error ~2 ulp on [-87, 88]; clamps outside (0 below, 2^128-ish
/// finite above; inputs here are max-subtracted logits or activations, never that large).
/// always_inline: a call per value does not vectorise. Where FMA is available, contraction would
/// change its bits: the per-ISA units of kernels/vec_ops.h build with -ffp-contract=off.
__attribute__((always_inline)) inline float ExpF(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round to nearest even with the 1.5·2^23 trick (vectorises without SSE4.1's roundps).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;  // ln2 high part (exact in fp32)
  r = r - n * 1.428606765330187e-06f;    // ln2 low part
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return p * scale;
}

}  // namespace nibble
