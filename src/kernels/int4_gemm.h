// Threaded entry points of the W4A32 kernels on the W4P layout (int4_packed.h): OpenMP splits N
// into fixed blocks of kW4BlockRows rows (and M into fixed chunks of kW4ChunkRows rows, so a chunk
// of x stays in L2 while the weight streams past it). Every output element is computed by exactly
// one thread in an order that depends on neither the block nor the thread count, so results are
// bit-identical for any number of threads. No allocation.
#pragma once

#include "kernels/int4_dispatch.h"
#include "kernels/int4_packed.h"

namespace nibble {

inline constexpr int64_t kW4BlockRows = 16;  // rows of W per work item
inline constexpr int64_t kW4ChunkRows = 64;  // rows of x per pass over W (M > 1)

/// y[M,N] = x[M,K] · dequant(W)ᵀ (+ bias) with the given kernels (nullptr: the active dispatch),
/// using the OpenMP threads of the calling context (omp_get_max_threads()).
/// Preconditions (abort): args.w, x, y non-null; m >= 0.
void GemmW4A32Packed(const W4PackedGemmArgs& args, const W4Kernels* kernels = nullptr);

/// out[N,K] fp32 = dequant(W), threaded like GemmW4A32Packed; values exact as DequantizeRef.
void DequantW4Packed(const W4PackedWeight& w, float* out, const W4Kernels* kernels = nullptr);

}  // namespace nibble
