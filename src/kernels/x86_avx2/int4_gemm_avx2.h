// AVX2 + FMA W4A32 kernels on the W4P layout. Call only when dispatch reports the ISA supported
// (CPUID + XCR0 YMM state); see kernels/int4_dispatch.h.
#pragma once

#include "kernels/int4_packed.h"
#include "kernels/stream_prefetch.h"

namespace nibble {

/// W4GemmKernel for AVX2: y[0..M)[n0..n1) = x · dequant(W)ᵀ (+ bias), fp32 accumulation. P: the
/// decode loop's prefetch hint (kernels/stream_prefetch.h); both are instantiated.
template <StreamPrefetch P>
void GemmW4A32Avx2(const W4PackedGemmArgs& args, int64_t n0, int64_t n1);
/// W4DequantKernel for AVX2: rows n0..n1 of W as fp32 [(n1 − n0), K], exact as DequantizeRef.
void DequantW4Avx2(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out);
/// Bf16GemvKernel for AVX2 (kernels/bf16_gemv.h): the weights widened in registers, 8 lanes.
void GemvBf16Avx2(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0, int64_t n1);
/// StreamReadKernel for AVX2: 32-byte loads, four independent accumulators.
uint64_t StreamReadAvx2(const uint64_t* p, int64_t words);

}  // namespace nibble
