// Threaded drivers of the W4A32 kernels (see int4_gemm.h).
#include "kernels/int4_gemm.h"

#include <algorithm>

#include "base/check.h"
#include "base/page_buffer.h"
#include "base/parallel.h"
#include "kernels/aligned_acts.h"

namespace nibble {

namespace {

// The kernels a driver runs: the caller's, else the active dispatch's.
const W4Kernels& KernelsOr(const W4Kernels* kernels) {
  return kernels != nullptr ? *kernels : ActiveW4Dispatch().kernels;
}

// The AMX tile kernel over m rows: each batch of up to kW4Bf16BatchMaxRows rows arranged once
// (the calling thread's scratch, reused), then shared by the team over the N blocks.
void GemmW4Bf16AmxBatches(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                          W4GemmBf16BatchKernel amx, bool parallel) {
  // The calling thread's, bounded: kW4Bf16BatchMaxRows (16) bf16 rows of K and their group
  // constants, about 2 x 16 x K bytes (0.5 MB at K = 14336) whatever M.
  thread_local PageBuffer scratch;
  const size_t bytes = W4Bf16BatchBytes(w.k, w.group_size);
  if (scratch.size() < bytes) scratch = PageBuffer(bytes);
  const int64_t nblocks = (w.n + kW4BlockRows - 1) / kW4BlockRows;
  for (int64_t i0 = 0; i0 < m; i0 += kW4Bf16BatchMaxRows) {
    const W4Bf16Batch batch = PrepareBf16Batch(a + i0, std::min(kW4Bf16BatchMaxRows, m - i0), scratch.data());
    float* yb = y + i0 * w.n;
    ParallelFor(nblocks, parallel,
                [&](int64_t b) { amx(w, batch, bias, yb, b * kW4BlockRows, std::min(w.n, (b + 1) * kW4BlockRows)); });
  }
}

}  // namespace

void GemmW4A32Packed(const W4PackedGemmArgs& a, const W4Kernels* kernels) {
  NIBBLE_CHECK(a.w != nullptr && a.m >= 0);
  if (a.m == 0 || a.w->n == 0) return;
  NIBBLE_CHECK(a.x != nullptr && a.y != nullptr && a.w->data != nullptr);
  const W4GemmKernel gemm = KernelsOr(kernels).gemm;
  const int64_t n = a.w->n;
  const int64_t nblocks = (n + kW4BlockRows - 1) / kW4BlockRows;
  // Tiny products are not worth waking the team (the result is the same either way).
  const bool parallel = nblocks > 1 && a.m * n * a.w->k >= kTeamMinWork;
  // x 64-byte aligned so that its loads never split cache lines (a copy, when needed, costs M·K
  // floats against M·K·N multiply-adds).
  const float* x = n >= kW4BlockRows ? AlignedActs(a.x, a.m * a.w->k) : a.x;
  const auto chunk = [&](int64_t i0) {
    W4PackedGemmArgs c = a;
    c.m = std::min(kW4ChunkRows, a.m - i0);
    c.x = x + i0 * a.w->k;
    c.y = a.y + i0 * n;
    return c;
  };
  // Each chunk of x rows, one ParallelFor over W's row blocks: the chunk's rows stay in cache.
  for (int64_t i0 = 0; i0 < a.m; i0 += kW4ChunkRows) {
    const W4PackedGemmArgs c = chunk(i0);
    ParallelFor(nblocks, parallel, [&](int64_t b) { gemm(c, b * kW4BlockRows, std::min(n, (b + 1) * kW4BlockRows)); });
  }
}

void GemmW4A8Packed(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y,
                    const W4Kernels* kernels) {
  NIBBLE_CHECK(W4Int8Supported(w) && m >= 0 && (m == 0 || (a != nullptr && y != nullptr)));
  for (int64_t i = 0; i < m; ++i) NIBBLE_CHECK(a[i].k == w.k && a[i].parts == W4Int8Parts(w.group_size));
  if (w.n == 0 || m == 0) return;
  const W4GemmI8Kernel gemm = KernelsOr(kernels).gemm_i8;
  const int64_t nblocks = (w.n + kW4BlockRows - 1) / kW4BlockRows;
  const bool parallel = nblocks > 1 && m * w.n * w.k >= kTeamMinWork;
  ParallelFor(nblocks, parallel,
              [&](int64_t b) { gemm(w, a, m, bias, y, b * kW4BlockRows, std::min(w.n, (b + 1) * kW4BlockRows)); });
}

bool W4Bf16AmxServes(const W4PackedWeight& w, int64_t m, const W4Kernels* kernels) {
  const W4Kernels& ks = KernelsOr(kernels);
  return ks.gemm_bf16_amx != nullptr && m >= kW4Bf16AmxMinRows && w.group_size % 128 == 0;
}

void GemmW4Bf16Packed(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                      const W4Kernels* kernels) {
  const W4Bf16Job job{&w, bias, y};
  GemmW4Bf16PackedMany(&job, 1, a, m, kernels);
}

void GemmW4Bf16PackedMany(const W4Bf16Job* jobs, int64_t count, const W4Bf16Acts* a, int64_t m,
                          const W4Kernels* kernels) {
  const W4Kernels& ks = KernelsOr(kernels);
  const W4GemmBf16Kernel gemm = ks.gemm_bf16;
  NIBBLE_CHECK(gemm != nullptr && count >= 0 && m >= 0 && (m == 0 || a != nullptr));
  int64_t nblocks = 0, work = 0;
  bool amx = false;
  for (int64_t j = 0; j < count; ++j) {
    const W4PackedWeight& w = *jobs[j].w;
    NIBBLE_CHECK(W4Bf16Supported(w) && (m == 0 || jobs[j].y != nullptr));
    for (int64_t i = 0; i < m; ++i) NIBBLE_CHECK(a[i].k == w.k && a[i].group_size == w.group_size);
    nblocks += (w.n + kW4BlockRows - 1) / kW4BlockRows;
    work += m * w.n * w.k;
    amx = amx || W4Bf16AmxServes(w, m, &ks);
  }
  if (nblocks == 0 || m == 0) return;
  const bool parallel = nblocks > 1 && work >= kTeamMinWork;
  if (amx && count == 1) return GemmW4Bf16AmxBatches(*jobs[0].w, a, m, jobs[0].bias, jobs[0].y, ks.gemm_bf16_amx, parallel);
  if (amx) {  // the tile kernel arranges the rows per weight: each weight its own pass
    for (int64_t j = 0; j < count; ++j) GemmW4Bf16PackedMany(jobs + j, 1, a, m, kernels);
    return;
  }
  // Block b of the pass: the first weight's blocks, then the next weight's, ...
  const auto block = [&](int64_t i0, int64_t b) {
    int64_t j = 0;
    for (int64_t nb; b >= (nb = (jobs[j].w->n + kW4BlockRows - 1) / kW4BlockRows); ++j) b -= nb;
    const W4PackedWeight& w = *jobs[j].w;
    gemm(w, a + i0, std::min(kW4ChunkRows, m - i0), jobs[j].bias, jobs[j].y + i0 * w.n, b * kW4BlockRows,
         std::min(w.n, (b + 1) * kW4BlockRows));
  };
  for (int64_t i0 = 0; i0 < m; i0 += kW4ChunkRows) ParallelFor(nblocks, parallel, [&](int64_t b) { block(i0, b); });
}

void DequantW4Packed(const W4PackedWeight& w, float* out, const W4Kernels* kernels) {
  NIBBLE_CHECK(out != nullptr && w.data != nullptr);
  const W4DequantKernel dq = KernelsOr(kernels).dequant;
  const int64_t nblocks = (w.n + kW4BlockRows - 1) / kW4BlockRows;
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = b * kW4BlockRows;
    dq(w, n0, std::min(w.n, n0 + kW4BlockRows), out + n0 * w.k);
  }
}

void DequantW4PackedBf16(const W4PackedWeight& w, uint16_t* out, const W4Kernels* kernels) {
  NIBBLE_CHECK(out != nullptr && w.data != nullptr);
  const W4DequantBf16Kernel dq = KernelsOr(kernels).dequant_bf16;
  const int64_t nblocks = (w.n + kW4BlockRows - 1) / kW4BlockRows;
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = b * kW4BlockRows;
    dq(w, n0, std::min(w.n, n0 + kW4BlockRows), out + n0 * w.k);
  }
}

}  // namespace nibble
