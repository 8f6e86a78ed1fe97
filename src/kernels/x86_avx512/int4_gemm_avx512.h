// AVX-512 (F/BW/VL/DQ + FMA) W4A32 kernels on the W4P layout. Call only when dispatch reports
// the ISA supported (CPUID + XCR0 ZMM state); see kernels/int4_dispatch.h.
#pragma once

#include "kernels/int4_packed.h"
#include "kernels/stream_prefetch.h"

namespace nibble {

/// W4GemmKernel for AVX-512: y[0..M)[n0..n1) = x · dequant(W)ᵀ (+ bias), fp32 accumulation. P: the
/// decode row GEMV's prefetch hint (kernels/stream_prefetch.h); both are instantiated.
template <StreamPrefetch P>
void GemmW4A32Avx512(const W4PackedGemmArgs& args, int64_t n0, int64_t n1);
/// W4DequantKernel for AVX-512: rows n0..n1 of W as fp32 [(n1 − n0), K], exact as DequantizeRef.
void DequantW4Avx512(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out);
/// W4DequantBf16Kernel for AVX-512: the same values rounded as F32ToBf16 does, bit for bit.
void DequantW4Bf16Avx512(const W4PackedWeight& w, int64_t n0, int64_t n1, uint16_t* out);
/// StreamReadKernel for AVX-512: 64-byte loads, four independent accumulators.
uint64_t StreamReadAvx512(const uint64_t* p, int64_t words);
/// Bf16GemvKernel for AVX-512 (kernels/bf16_gemv.h; in bf16_gemv_avx512.cc).
void GemvBf16Avx512(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0, int64_t n1);

}  // namespace nibble
