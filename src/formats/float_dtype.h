// Scales stored in a float dtype (F32 / F16 / BF16): rounding, encoding and decoding.
//
// Quark stores `weight_scale` in the model dtype (SPEC §1.4 "Scale dtype"), so the quantizer
// rounds each scale to that dtype before using it, the exporter writes those bytes and the
// importer reads them back to fp32 exactly (every F16/BF16 value is an fp32 value).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/half.h"
#include "io/safetensors.h"

namespace nibble {

/// True for the dtypes a scale may be stored in: F32, F16, BF16.
inline bool IsFloatScaleDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

/// Rounds an fp32 value to the nearest value representable in `t` (round to nearest even;
/// F16 overflows to ±inf). Precondition: IsFloatScaleDType(t) (other dtypes return `v`).
inline float RoundToDType(float v, DType t) {
  if (t == DType::kF16) return F16ToF32(F32ToF16(v));
  if (t == DType::kBF16) return Bf16ToF32(F32ToBf16(v));
  return v;
}

/// Writes `v` as one little-endian element of dtype `t` at `dst` (DTypeSize(t) bytes).
/// Precondition: IsFloatScaleDType(t).
inline void StoreFloatAs(float v, DType t, uint8_t* dst) {
  if (t == DType::kF16) {
    uint16_t h = F32ToF16(v);
    std::memcpy(dst, &h, 2);
  } else if (t == DType::kBF16) {
    uint16_t h = F32ToBf16(v);
    std::memcpy(dst, &h, 2);
  } else {
    std::memcpy(dst, &v, 4);
  }
}

/// Reads one little-endian element of dtype `t` (F32/F16/BF16) at `src` as fp32 (exact).
inline float LoadFloatAs(const uint8_t* src, DType t) {
  if (t == DType::kF16 || t == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    return t == DType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
  }
  float v;
  std::memcpy(&v, src, 4);
  return v;
}

}  // namespace nibble
