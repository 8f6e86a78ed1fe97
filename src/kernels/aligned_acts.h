// 64-byte alignment of activation rows for the GEMV/GEMM kernels.
#pragma once

#include <cstdint>

namespace nibble {

/// Alignment (bytes) at which the fp32 activation loads of the W4A32 and bf16 kernels never
/// straddle two cache lines: one 64-byte zmm load per 16 values of x.
inline constexpr int64_t kActsAlignment = 64;

/// Returns `x` itself when it is kActsAlignment-aligned, else a copy of its `count` floats in a
/// scratch buffer of the calling thread, aligned to kActsAlignment (valid until that thread's
/// next call; other threads may read it meanwhile, e.g. inside the caller's parallel region).
/// The values are copied exactly, so results do not change — only the speed: with x misaligned
/// (std::vector / malloc give 16 bytes) every 64-byte load of x splits over two cache lines
/// (docs/PERFORMANCE.md "Aligned x"). Allocates only when the thread's scratch grows.
/// Preconditions (abort): count >= 0; x non-null when count > 0.
const float* AlignedActs(const float* x, int64_t count);

}  // namespace nibble
