// AVX-512 BF16 + VBMI W4A16 GEMM with bf16 activations on the W4P layout: the opt-in
// bf16-activation path (kernels/int4_packed.h, W4Bf16Acts). Call only when dispatch reports
// AVX-512 with avx512_bf16 and avx512_vbmi supported (CPUID + XCR0 ZMM state); see
// kernels/int4_dispatch.h.
#pragma once

#include <cstdint>

#include "kernels/int4_packed.h"
#include "kernels/stream_prefetch.h"

namespace nibble {

/// W4GemmBf16Kernel for AVX-512 BF16: per 32 weights one `vpmultishiftqb` + one `vpternlogd` turn
/// the codes into the bf16 words 0x4300 | q (= 128 + q) and one `vdpbf16ps` multiplies them with
/// the prepared activations (32 products). One activation row (decode): per group the accumulator
/// starts at the zero-point correction c0 + z·c1 and is scaled into one of four running sums, one
/// weight row at a time (a flat loop over the records at g = 128, eight rows in chunks of K past
/// W4DecodeChunkMinK, same bits; row tiles at other g); row tiles
/// of up to 3 activation rows for any M where g is not a multiple of 128. From
/// kW4Bf16BlockMinRows activation rows on (batched decode and up), when g is a multiple of 128,
/// blocks of 2 weight rows × up to 8 activation rows whose chains start at zero, with the
/// zero-point corrections added 16 groups per vector (a different fixed order, so results for
/// such M are deterministic and independent of the N split and of the row's slot in the block,
/// but not bit-identical to the same row run alone). Arithmetic per (row, weight row) in
/// docs/KERNELS.md "bf16 activations".
/// P: the decode loop's prefetch hint (kernels/stream_prefetch.h); A: the blocks' arithmetic
/// (W4Bf16BlockArith); all four are instantiated.
constexpr int64_t kW4Bf16BlockMinRows = 2;
/// How the blocks multiply: `vdpbf16ps`, or two fp32 FMAs per product pair in vdpbf16ps's order
/// (the same bits, tested) for cores whose `vdpbf16ps` issues at half their FMA rate (Intel
/// without AMX; docs/KERNELS.md "FMA blocks").
enum class W4Bf16BlockArith { kDpbf16, kFma };
template <StreamPrefetch P, W4Bf16BlockArith A = W4Bf16BlockArith::kDpbf16, W4Bf16Unpack U = W4Bf16Unpack::kMultishift>
void GemmW4Bf16Avx512(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                      int64_t n0, int64_t n1);

/// A block of the many-row kernel (g a multiple of 128): `rows` weight rows × `acts` activation
/// rows, each decoded run feeding `acts` dot products and each activation load `rows`.
struct W4Bf16BlockShape {
  int64_t rows = 2;
  int64_t acts = 4;
};
constexpr int64_t kW4Bf16BlockMaxRows = 4;
constexpr int64_t kW4Bf16BlockMaxActs = 8;
/// The shape GemmW4Bf16Avx512 runs from kW4Bf16BlockMinRows rows on: up to 8 rows in one pass over
/// each weight row (docs/PERFORMANCE.md "Batched decode", "Block shapes").
constexpr W4Bf16BlockShape kW4Bf16BlockShape{2, 8};
/// The many-row kernel in blocks of `shape` (remainders of N and M in smaller blocks). The shape
/// only orders the (activation row, weight row) pairs, whose arithmetic is fixed by K and g: every
/// shape gives the same bits (tested against 2 × 4 blocks for M = 2..16).
void GemmW4Bf16Avx512Blocks(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                            int64_t n0, int64_t n1, W4Bf16BlockShape shape,
                            W4Bf16BlockArith arith = W4Bf16BlockArith::kDpbf16);

}  // namespace nibble
