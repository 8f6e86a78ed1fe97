// Quark RTN reference quantizer (see rtn.h for the arithmetic and its sources).
#include "formats/rtn.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <string>

#include "formats/float_dtype.h"

namespace nibble {

Status CheckRtnArgs(int64_t n, int64_t k, const QuantSpec& spec, DType scale_dtype) {
  if (n < 1 || k < 1) return MakeError("QuantizeRtnRef: weight shape [", n, ", ", k, "] must have N >= 1 and K >= 1");
  if (!IsFloatScaleDType(scale_dtype))
    return MakeErrorCode(ErrorCode::kUnsupported, "QuantizeRtnRef: scale dtype ", DTypeName(scale_dtype), " is not supported (expected F32, F16 or BF16)");
  if (spec.rounding != Rounding::kHalfEven)
    return MakeErrorCode(ErrorCode::kUnsupported, "QuantizeRtnRef: round_method \"", RoundingName(spec.rounding), "\" is not implemented (expected \"half_even\")");
  if (spec.bits != 4) return MakeErrorCode(ErrorCode::kUnsupported, "QuantizeRtnRef: ", spec.bits, "-bit weights are not supported (expected 4)");
  if (spec.granularity == Granularity::kPerChannel && spec.group_size != -1)
    return MakeError("QuantizeRtnRef: per_channel spec has group_size ", spec.group_size, ", expected -1");
  if (spec.group_size == 0 || spec.group_size < -1)
    return MakeError("QuantizeRtnRef: invalid group_size ", spec.group_size, " (expected a positive integer or -1)");
  const int64_t g = spec.EffectiveGroupSize(k);
  if (k % g != 0)
    return MakeError("QuantizeRtnRef: input size K = ", k, " is not aligned with group_size ", g, " (N = ", n, ", K = ", k,
                     ", g = ", g, "); K must be a multiple of the group size");
  if (n > INT64_MAX / k) return MakeError("QuantizeRtnRef: N * K overflows (N = ", n, ", K = ", k, ")");
  return Status::Ok();
}

Result<Int4Matrix> QuantizeRtnRef(const float* w, int64_t n, int64_t k, const QuantSpec& spec, DType scale_dtype) {
  NIBBLE_RETURN_IF_ERROR(CheckRtnArgs(n, k, spec, scale_dtype));
  const bool sym = spec.symmetric;
  const int64_t g = spec.EffectiveGroupSize(k);
  const int64_t groups = k / g;
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = sym;
  m.codes.resize(static_cast<size_t>(n * k));
  m.scales.resize(static_cast<size_t>(n * groups));
  m.zero_points.resize(static_cast<size_t>(n * groups));

  // nearbyint honours the current rounding mode; the spec needs round-to-nearest-even.
  const int saved_mode = std::fegetround();
  if (saved_mode != FE_TONEAREST) std::fesetround(FE_TONEAREST);
  Error error{};
  bool failed = false;
  for (int64_t r = 0; r < n && !failed; ++r) {
    for (int64_t gi = 0; gi < groups && !failed; ++gi) {
      const float* x = w + r * k + gi * g;
      float mn = 0.f, mx = 0.f;
      for (int64_t i = 0; i < g; ++i) {
        if (!std::isfinite(x[i])) {
          error = MakeError("QuantizeRtnRef: weight[", r, "][", gi * g + i, "] = ", x[i], " is not finite");
          failed = true;
          break;
        }
        mn = std::min(mn, x[i]);
        mx = std::max(mx, x[i]);
      }
      if (failed) break;
      RtnGroupParams p;
      if (!RtnGroupOf(mn, mx, sym, scale_dtype, &p)) {
        error = MakeError("QuantizeRtnRef: scale of row ", r, " group ", gi, " overflows ", DTypeName(scale_dtype),
                          " (range [", mn, ", ", mx, "])");
        failed = true;
        break;
      }
      const float s = p.s, z = p.z, inv = p.inv;
      for (int64_t i = 0; i < g; ++i) m.codes[static_cast<size_t>(r * k + gi * g + i)] = QuarkCode(x[i], inv, z, sym);
      m.scales[static_cast<size_t>(r * groups + gi)] = s;
      m.zero_points[static_cast<size_t>(r * groups + gi)] = static_cast<uint8_t>(sym ? 8 : static_cast<int>(z));
    }
  }
  if (saved_mode != FE_TONEAREST) std::fesetround(saved_mode);
  if (failed) return error;
  return m;
}

}  // namespace nibble
