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

// Row blocks of kW4BlockRows rows in a weight.
int64_t Blocks(const W4PackedWeight& w) { return (w.n + kW4BlockRows - 1) / kW4BlockRows; }

// The row blocks of every job's weight claimed from one parallel pass: the first weight's blocks,
// then the next weight's, ...; block(job, n0, n1) runs rows [n0, n1) of that job's weight.
template <class F>
void OnePass(const W4Job* jobs, int64_t count, int64_t m, F&& block) {
  int64_t nblocks = 0, work = 0;
  for (int64_t j = 0; j < count; ++j) {
    nblocks += Blocks(*jobs[j].w);
    work += m * jobs[j].w->n * jobs[j].w->k;
  }
  if (nblocks == 0 || m == 0) return;
  // Tiny products are not worth waking the team (the result is the same either way).
  ParallelFor(nblocks, nblocks > 1 && work >= kTeamMinWork, [&](int64_t b) {
    int64_t j = 0;
    for (int64_t nb; b >= (nb = Blocks(*jobs[j].w)); ++j) b -= nb;
    const int64_t n = jobs[j].w->n;
    block(jobs[j], b * kW4BlockRows, std::min(n, (b + 1) * kW4BlockRows));
  });
}

}  // namespace

void GemmW4A32Packed(const W4PackedGemmArgs& a, const W4Kernels* kernels) {
  NIBBLE_CHECK(a.w != nullptr && a.m >= 0);
  const W4Job job{a.w, a.bias, a.y};
  GemmW4A32PackedMany(&job, 1, a.x, a.m, kernels);
}

void GemmW4A32PackedMany(const W4Job* jobs, int64_t count, const float* x, int64_t m, const W4Kernels* kernels) {
  NIBBLE_CHECK(count >= 0 && m >= 0);
  if (m == 0 || count == 0) return;
  const int64_t k = jobs[0].w->k;
  bool wide = false;
  for (int64_t j = 0; j < count; ++j) {
    const W4PackedWeight& w = *jobs[j].w;
    NIBBLE_CHECK(w.k == k && (w.n == 0 || (x != nullptr && jobs[j].y != nullptr && w.data != nullptr)));
    wide = wide || w.n >= kW4BlockRows;
  }
  const W4GemmKernel gemm = KernelsOr(kernels).gemm;
  // x 64-byte aligned so that its loads never split cache lines (a copy, when needed, costs M·K
  // floats against M·K·N multiply-adds).
  const float* xa = wide ? AlignedActs(x, m * k) : x;
  // Each chunk of x rows, one pass over the weights' row blocks: the chunk's rows stay in cache.
  for (int64_t i0 = 0; i0 < m; i0 += kW4ChunkRows) {
    OnePass(jobs, count, m, [&](const W4Job& job, int64_t n0, int64_t n1) {
      const W4PackedGemmArgs c{std::min(kW4ChunkRows, m - i0), job.w, xa + i0 * k, job.bias, job.y + i0 * job.w->n};
      gemm(c, n0, n1);
    });
  }
}

void GemmW4A8Packed(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y,
                    const W4Kernels* kernels) {
  const W4Job job{&w, bias, y};
  GemmW4A8PackedMany(&job, 1, a, m, kernels);
}

void GemmW4A8PackedMany(const W4Job* jobs, int64_t count, const W4Int8Acts* a, int64_t m, const W4Kernels* kernels) {
  NIBBLE_CHECK(count >= 0 && m >= 0 && (m == 0 || a != nullptr));
  for (int64_t j = 0; j < count; ++j) {
    const W4PackedWeight& w = *jobs[j].w;
    NIBBLE_CHECK(W4Int8Supported(w) && (m == 0 || jobs[j].y != nullptr));
    for (int64_t i = 0; i < m; ++i) NIBBLE_CHECK(a[i].k == w.k && a[i].parts == W4Int8Parts(w.group_size));
  }
  const W4GemmI8Kernel gemm = KernelsOr(kernels).gemm_i8;
  OnePass(jobs, count, m,
          [&](const W4Job& job, int64_t n0, int64_t n1) { gemm(*job.w, a, m, job.bias, job.y, n0, n1); });
}

bool W4Bf16AmxServes(const W4PackedWeight& w, int64_t m, const W4Kernels* kernels) {
  const W4Kernels& ks = KernelsOr(kernels);
  return ks.gemm_bf16_amx != nullptr && m >= kW4Bf16AmxMinRows && w.group_size % 128 == 0;
}

void GemmW4Bf16Packed(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                      const W4Kernels* kernels) {
  const W4Job job{&w, bias, y};
  GemmW4Bf16PackedMany(&job, 1, a, m, kernels);
}

void GemmW4Bf16PackedMany(const W4Job* jobs, int64_t count, const W4Bf16Acts* a, int64_t m,
                          const W4Kernels* kernels) {
  const W4Kernels& ks = KernelsOr(kernels);
  const W4GemmBf16Kernel gemm = ks.gemm_bf16;
  NIBBLE_CHECK(gemm != nullptr && count >= 0 && m >= 0 && (m == 0 || a != nullptr));
  bool amx = false;
  int64_t work = 0;
  for (int64_t j = 0; j < count; ++j) {
    const W4PackedWeight& w = *jobs[j].w;
    NIBBLE_CHECK(W4Bf16Supported(w) && (m == 0 || jobs[j].y != nullptr));
    for (int64_t i = 0; i < m; ++i) NIBBLE_CHECK(a[i].k == w.k && a[i].group_size == w.group_size);
    amx = amx || W4Bf16AmxServes(w, m, &ks);
    work += m * w.n * w.k;
  }
  if (m == 0 || count == 0) return;
  if (amx && count == 1) {
    const bool parallel = Blocks(*jobs[0].w) > 1 && work >= kTeamMinWork;
    return GemmW4Bf16AmxBatches(*jobs[0].w, a, m, jobs[0].bias, jobs[0].y, ks.gemm_bf16_amx, parallel);
  }
  if (amx) {  // the tile kernel arranges the rows per weight: each weight its own pass
    for (int64_t j = 0; j < count; ++j) GemmW4Bf16PackedMany(jobs + j, 1, a, m, kernels);
    return;
  }
  for (int64_t i0 = 0; i0 < m; i0 += kW4ChunkRows)
    OnePass(jobs, count, m, [&](const W4Job& job, int64_t n0, int64_t n1) {
      gemm(*job.w, a + i0, std::min(kW4ChunkRows, m - i0), job.bias, job.y + i0 * job.w->n, n0, n1);
    });
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
