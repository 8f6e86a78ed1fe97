// Threaded entry points of the W4A32 kernels on the W4P layout (int4_packed.h): OpenMP splits N
// into fixed blocks of kW4BlockRows rows (and M into fixed chunks of kW4ChunkRows rows, so a chunk
// of x stays in L2 while the weight streams past it). Every output element is computed by exactly
// one thread in an order that depends on neither the block nor the thread count, so results are
// bit-identical for any number of threads. x is read 64-byte aligned (AlignedActs: misaligned x is
// copied once per call into a per-thread scratch, which allocates only when it grows).
#pragma once

#include "kernels/int4_dispatch.h"
#include "kernels/int4_packed.h"

namespace nibble {

inline constexpr int64_t kW4BlockRows = 16;  // rows of W per work item
inline constexpr int64_t kW4ChunkRows = 64;  // rows of x per pass over W (M > 1)

/// One weight of a pass over several weights reading the same rows (attention's q / k / v, the
/// MLP's gate / up): y[M, w.n] = rows · wᵀ (+ bias, nullable).
struct W4Job {
  const W4PackedWeight* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};

/// y[M,N] = x[M,K] · dequant(W)ᵀ (+ bias) with the given kernels (nullptr: the active dispatch),
/// using the OpenMP threads of the calling context (omp_get_max_threads()).
/// Preconditions (abort): args.w, x, y non-null; m >= 0.
void GemmW4A32Packed(const W4PackedGemmArgs& args, const W4Kernels* kernels = nullptr);
/// GemmW4A32Packed for `count` weights of one K on the same x[m, K]: their row blocks are claimed
/// from one parallel pass per chunk of rows, one fork and join instead of one per weight; each
/// output gets the bits GemmW4A32Packed gives it (the same kernel call per block). Preconditions
/// as GemmW4A32Packed's, for every job.
void GemmW4A32PackedMany(const W4Job* jobs, int64_t count, const float* x, int64_t m,
                         const W4Kernels* kernels = nullptr);

/// y[M,N] = the opt-in W4A8 GEMM of M quantized activation rows `a` (QuantizeActsInt8) against W
/// (+ bias), threaded like GemmW4A32Packed (bit-identical for any thread count) with the given
/// kernels' gemm_i8 (nullptr: the active dispatch). Preconditions (abort): W4Int8Supported(w),
/// every a[i].k == w.k and a[i].parts == W4Int8Parts(w.group_size), y non-null, m >= 0.
void GemmW4A8Packed(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y,
                    const W4Kernels* kernels = nullptr);
/// GemmW4A8Packed for `count` weights of one K and g on the same quantized rows, in one pass as
/// GemmW4A32PackedMany (each output with its own bits). Preconditions as GemmW4A8Packed's.
void GemmW4A8PackedMany(const W4Job* jobs, int64_t count, const W4Int8Acts* a, int64_t m,
                        const W4Kernels* kernels = nullptr);
/// y[M,N] = the opt-in bf16-activation GEMM of M prepared rows `a` (PrepareActsBf16) against W
/// (+ bias) with the given kernels' gemm_bf16 (nullptr: the active dispatch), threaded like
/// GemmW4A32Packed (N split in fixed blocks, M in chunks of kW4ChunkRows; bit-identical for any
/// thread count). Preconditions (abort): the kernels have a gemm_bf16, W4Bf16Supported(w), every
/// a[i].k == w.k and a[i].group_size == w.group_size, y non-null, m >= 0.
void GemmW4Bf16Packed(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                      const W4Kernels* kernels = nullptr);
/// GemmW4Bf16Packed for `count` weights of one K and g on the same prepared rows, in one pass as
/// GemmW4A32PackedMany (each output with its own bits). Where the AMX tile kernel serves a weight
/// at this m, each weight runs its own GemmW4Bf16Packed. Preconditions as GemmW4Bf16Packed's.
void GemmW4Bf16PackedMany(const W4Job* jobs, int64_t count, const W4Bf16Acts* a, int64_t m,
                          const W4Kernels* kernels = nullptr);
/// Whether GemmW4Bf16Packed runs `m` rows of W on the kernels' AMX tile kernel (nullptr: the
/// active dispatch): the kernels have one, m >= kW4Bf16AmxMinRows and g % 128 == 0. It takes
/// the rows kW4Bf16BatchMaxRows at a time, one pass over W each.
bool W4Bf16AmxServes(const W4PackedWeight& w, int64_t m, const W4Kernels* kernels = nullptr);
/// out[N,K] fp32 = dequant(W), threaded like GemmW4A32Packed; values exact as DequantizeRef.
void DequantW4Packed(const W4PackedWeight& w, float* out, const W4Kernels* kernels = nullptr);
/// out[N,K] bf16 bit patterns = bf16(dequant(W)) (the exact fp32 value rounded to nearest even),
/// threaded like DequantW4Packed: the weights a W4A16 engine multiplies bf16 activations with.
void DequantW4PackedBf16(const W4PackedWeight& w, uint16_t* out, const W4Kernels* kernels = nullptr);

}  // namespace nibble
