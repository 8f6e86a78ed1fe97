// AMX-BF16 W4A16 GEMM for batched decode (2..16 bf16 activation rows) on the W4P layout. Call
// only when dispatch reports the AMX kernel (CPUID amx_tile + amx_bf16, XCR0 tile state, and the
// kernel's grant of tile data to the process: DetectCpuFeatures asks for it); see
// kernels/int4_dispatch.h.
#pragma once

#include <cstdint>

#include "kernels/int4_packed.h"

namespace nibble {

/// W4GemmBf16BatchKernel for AMX (g a multiple of 128). 16 weight rows at a time are the left
/// tile operand: per superblock the codes of the 16 rows become the bf16 words 0x4300 | q (=
/// 128 + q, as in the AVX-512 BF16 kernel) in four 16 × 32-word tiles, multiplied with the
/// batch's pair tiles into 16 × M fp32 tiles by `tdpbf16ps`. Per group and (row, activation
/// row): chain 0 over runs 0, 2 and chain 1 over runs 1, 3 of each superblock (from zero), then
/// sum = fma(s, (chain0 + chain1) + fma(z, 16·c1, 16·c0), sum), groups in order; the bias last.
void GemmW4Bf16Amx(const W4PackedWeight& w, const W4Bf16Batch& batch, const float* bias, float* y, int64_t n0,
                   int64_t n1);

}  // namespace nibble
