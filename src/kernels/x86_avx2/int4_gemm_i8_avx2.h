// AVX2 W4A8 GEMM on the W4P layout: the opt-in int8-activation path (kernels/int4_packed.h,
// W4Int8Acts) on CPUs without AVX-512 VNNI. Call only when dispatch reports AVX2 supported
// (CPUID + XCR0 YMM state); see kernels/int4_dispatch.h.
#pragma once

#include "kernels/int4_packed.h"
#include "kernels/stream_prefetch.h"

namespace nibble {

/// W4GemmI8Kernel for AVX2: each 4-byte dot product of the VNNI kernel as `vpmaddubsw` (codes ×
/// int8 activations, pairs into int16) and `vpmaddwd` by ones (pairs into int32), the same exact
/// lane sums; one weight row at a time against up to 4 activation rows, decode at g = 128 through
/// one flat loop per row. Lane sums and fp32 accumulation exactly as GemmW4A8PackedScalar, so
/// results are bit-identical to it. P: the decode loop's prefetch hint; both are instantiated.
template <StreamPrefetch P>
void GemmW4A8Avx2(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t n0,
                  int64_t n1);

}  // namespace nibble
