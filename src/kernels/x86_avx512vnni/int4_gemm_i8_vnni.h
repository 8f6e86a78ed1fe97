// AVX-512 VNNI (F/BW/VL/DQ + VNNI) W4A8 GEMM on the W4P layout: the opt-in int8-activation path
// (kernels/int4_packed.h, W4Int8Acts). Call only when dispatch reports AVX-512 and avx512_vnni
// supported (CPUID + XCR0 ZMM state); see kernels/int4_dispatch.h.
#pragma once

#include "kernels/int4_packed.h"
#include "kernels/stream_prefetch.h"

namespace nibble {

/// W4GemmI8Kernel for AVX-512 VNNI: `vpdpbusd` (unsigned codes × signed int8 activations, 64
/// products per instruction) on each superblock's low / high nibbles, one weight row at a time
/// against up to 4 activation rows (each superblock is unpacked once for all of them; decode at
/// g = 128 through one flat loop per row), or 16 weight rows in the lanes from 6 activation rows
/// on (g a multiple of 128); lane sums and fp32 accumulation exactly as GemmW4A8PackedScalar, so
/// results are bit-identical to it. P: the decode loop's prefetch hint (kernels/stream_prefetch.h);
/// both are instantiated.
template <StreamPrefetch P>
void GemmW4A8Vnni(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t n0,
                  int64_t n1);

}  // namespace nibble
