// Quark round-to-nearest (RTN) 4-bit weight quantization, scalar reference (SPEC §4.1, §4.6).
//
// Goal: the executable spec of what Quark's PerGroupMinMaxObserver + real quantizer produce for a
// weight, so that our exports match Quark's bit for bit on the same input. Non-goals: speed
// (a vectorised version can be checked against this one), AWQ/GPTQ (they choose the weights that
// are fed here, or the codes directly), AutoAWQ's different RTN (range without 0, /7 symmetric).
//
// Arithmetic, step by step, for one group x[0..g) of one output row (model dtype D = scale_dtype):
//   mn = min(min(x), 0), mx = max(max(x), 0)                                  (exact)
//   uint4: s = D(D(mx - mn) / 15)        int4: s = D(max(-mn, mx) / 7.5)
//   s = max(s, 2^-23)                    (fp32 eps = 1.1920929e-07, exactly representable in D)
//   uint4: z = clamp(-rint(D(mn / s)), 0, 15)          int4: z = 0
//   q = clamp(rint(x * fp32(1 / s) + z), qmin, qmax)   (fp32; int4: [-8, 7], uint4: [0, 15])
// where D(v) rounds an fp32 result to D (round to nearest even) and rint is round-half-to-even
// (std::nearbyint under the default rounding mode; std::round would round ties away from 0).
// Why each step is so: Quark's observer (quark/torch/quantization/observer/observer.py
// calculate_int_quant_params) runs on min/max tensors in the weight dtype, so every torch op of
// the scale and zero-point computation rounds to D; the scale is then stored as is (scale_type
// "float" keeps the model dtype, SPEC §1.4). Rounding s to D *before* computing z and q makes the
// codes consistent with the stored scale. Quark's real quantizer (hw_emulation_interface.py
// real_quantize_int_per_group_affine) casts to fp32, multiplies by the reciprocal 1/s (not a
// division — it mirrors aten's fake_quantize) and adds z before torch.round; we do the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "base/result.h"
#include "formats/int4_matrix.h"
#include "formats/quant_spec.h"
#include "formats/float_dtype.h"
#include "io/safetensors.h"

namespace nibble {

/// torch.finfo(torch.float32).eps = 2^-23: the smallest scale RTN writes.
inline constexpr float kRtnMinScale = 1.1920928955078125e-07f;

/// One group's parameters as QuantizeRtnRef computes them from the group's mn = min(min(x), 0)
/// and mx = max(max(x), 0): the scale s (rounded to scale_dtype), the zero point z (uint4; 0 for
/// int4) and the reciprocal inv = fp32(1 / s) the codes are computed with. False when s is not
/// finite (overflows scale_dtype). Shared by the reference and the fast path
/// (quantize/rtn_fast.h), so the two compute the same bits. Needs the default rounding mode.
struct RtnGroupParams {
  float s = 0, z = 0, inv = 0;
};
inline bool RtnGroupOf(float mn, float mx, bool symmetric, DType scale_dtype, RtnGroupParams* p) {
  auto D = [scale_dtype](float v) { return RoundToDType(v, scale_dtype); };
  float s = symmetric ? D(std::max(-mn, mx) / 7.5f) : D(D(mx - mn) / 15.f);
  s = std::max(s, kRtnMinScale);
  if (!std::isfinite(s)) return false;
  p->s = s;
  p->z = symmetric ? 0.f : std::clamp(-std::nearbyint(D(mn / s)), 0.f, 15.f);
  p->inv = 1.f / s;
  return true;
}

/// The argument checks of QuantizeRtnRef (its errors but the per-value ones), so a faster
/// implementation refuses exactly what the reference refuses.
Status CheckRtnArgs(int64_t n, int64_t k, const QuantSpec& spec, DType scale_dtype);

/// Quantizes a dense weight w [N = out_features, K = in_features] (row-major fp32 holding values
/// of the model dtype) with Quark RTN as described above. Returns an Int4Matrix in the native
/// convention (int4 codes stored as q + 8 with zero points 8; group_size = K for per-channel or
/// group_size −1), scales as fp32 values exactly representable in `scale_dtype`.
/// An all-zero group gets s = 2^-23, z = 0 (uint4) and dequantizes to exact zeros.
/// Errors: n < 1 or k < 1; K not a multiple of g ("input size K = 100 is not aligned with
/// group_size 32 (N = 8, K = 100, g = 32)", cf. vLLM's "input size is not aligned with the
/// quantized weight shape"); scale_dtype not F32/F16/BF16; spec.rounding not half-even; bits
/// other than 4; a non-finite weight (names row and
/// column); a scale that overflows scale_dtype (F16 above 65504).
Result<Int4Matrix> QuantizeRtnRef(const float* w, int64_t n, int64_t k, const QuantSpec& spec, DType scale_dtype);

/// The native code (0..15) of one weight x under a group's reciprocal scale `inv` = fp32(1 / s)
/// and zero point z (uint4; 0 for int4), exactly as QuantizeRtnRef computes it: x · inv rounded to
/// fp32 on its own (the volatile store keeps the compiler from contracting it with + z into an
/// FMA, which would skip the rounding torch performs after the mul), then rounded half to even
/// (default rounding mode) and clamped; int4 codes are stored as q + 8. Shared by every algorithm
/// that quantizes against given group parameters (GPTQ).
inline uint8_t QuarkCode(float x, float inv, float z, bool symmetric) {
  volatile float p = x * inv;
  const float q = std::clamp(std::nearbyint(p + z), symmetric ? -8.f : 0.f, symmetric ? 7.f : 15.f);
  return static_cast<uint8_t>(static_cast<int>(q) + (symmetric ? 8 : 0));
}

}  // namespace nibble
