// Dense fp32 matrix products for the fp path (dense linears, attention scores), backed by
// oneDNN's sgemm, which picks its kernels from CPU feature flags at run time (no environment
// variable needed, unlike Debian's OpenBLAS 0.3.21 on recent Xeons). Row-major everywhere.
#pragma once

#include <cstdint>

namespace nibble {

/// y[M,N] = x[M,K] · w[N,K]ᵀ + beta · y.  Leading dimensions in elements (row strides).
/// Preconditions (aborts otherwise): m, n, k > 0; ld* >= the row length.
void SgemmXWt(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float beta, float* y, int64_t ldy);

/// SgemmXWt with beta = 0 whose sums do not depend on the thread count: oneDNN's threaded sgemm
/// partitions large products by the number of threads and rounds differently with each, so a
/// prefill's logits moved with --threads. Here the product runs as a grid of tiles fixed by
/// (m, n) (SgemmTileGrid), each one single-threaded sgemm, the tiles claimed by the calling
/// thread's OpenMP team (or run in turn on one thread). For the model's linears; m, n, k > 0,
/// ld* >= the row length.
void SgemmXWtTiled(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
                   int64_t ldw, float* y, int64_t ldy);

/// SgemmXWtTiled's grid: tiles of `rows` x `cols` (the last ones cut short), from (m, n) alone.
struct SgemmTileGrid {
  int64_t rows = 0, cols = 0, m_tiles = 0, n_tiles = 0;
};
SgemmTileGrid SgemmTilesFor(int64_t m, int64_t n);

/// y[M,N] = x[M,K] · w[K,N] + beta · y.  Leading dimensions in elements.
void SgemmXW(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float beta, float* y, int64_t ldy);

/// y[M,N] = a[K,M]ᵀ · b[K,N] + beta · y (e.g. a Gram matrix XᵀX with a = b = X).  Leading
/// dimensions in elements. Preconditions (aborts otherwise): m, n, k > 0; lda >= m, ldb >= n,
/// ldy >= n.
void SgemmAtB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* y, int64_t ldy);

/// y[M,N] = x[M,K] · w[N,K]ᵀ for bf16 bit patterns x and w (row-major, dense), fp32 products
/// (exact for bf16 inputs) and fp32 accumulation, through oneDNN's bf16 matmul (AMX or AVX-512
/// BF16 where the CPU has them; one primitive per (N, K) and thread, M a runtime dimension).
/// Returns false and writes nothing when oneDNN has no optimized bf16 kernel for this CPU, or
/// when the fp32 sgemm on the widened values is faster (W4Kernels::bf16_prefill_sgemm: Intel
/// without AMX); the callers then widen.
bool GemmBf16XWt(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* w, float* y);

/// Whether GemmBf16XWt runs (oneDNN has an optimized bf16 kernel that is not declined) for this
/// (N, K).
bool GemmBf16Usable(int64_t n, int64_t k);

/// Whether oneDNN runs its matmuls on AMX tiles on this CPU (its effective ISA includes
/// avx512_core_amx).
bool DenseGemmHasAmx();

}  // namespace nibble
