#include "kernels/dense_gemm.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "base/check.h"
#include "base/parallel.h"
#include "kernels/int4_dispatch.h"

namespace nibble {

void SgemmXWt(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float beta, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldy >= n);
  dnnl_status_t st = dnnl_sgemm('N', 'T', m, n, k, 1.0f, x, ldx, w, ldw, beta, y, ldy);
  NIBBLE_CHECK_MSG(st == dnnl_success, "dnnl_sgemm status %d", static_cast<int>(st));
}

// 512 columns of W per tile, and row blocks of 512 halved (to 128 at least) until the grid has 8
// tiles, so small linears still spread over several threads; each tile repacks its rows of x, so
// smaller tiles cost more on one thread (docs/PERFORMANCE.md "Tiled sgemm").
SgemmTileGrid SgemmTilesFor(int64_t m, int64_t n) {
  constexpr int64_t kCols = 512, kMinRows = 128, kMinTiles = 8;
  SgemmTileGrid g;
  g.cols = std::min(n, kCols);
  g.n_tiles = (n + g.cols - 1) / g.cols;
  g.rows = 512;
  while (g.rows > kMinRows && (m + g.rows - 1) / g.rows * g.n_tiles < kMinTiles) g.rows /= 2;
  g.rows = std::min(m, g.rows);
  g.m_tiles = (m + g.rows - 1) / g.rows;
  return g;
}

void SgemmXWtTiled(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
                   int64_t ldw, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= k && ldy >= n);
  const SgemmTileGrid g = SgemmTilesFor(m, n);
  const int64_t tiles = g.m_tiles * g.n_tiles;
  const auto tile = [&](int64_t t) {
    const int64_t m0 = t / g.n_tiles * g.rows, n0 = t % g.n_tiles * g.cols;
    const int64_t mt = std::min(g.rows, m - m0), nt = std::min(g.cols, n - n0);
    SgemmXWt(mt, nt, k, x + m0 * ldx, ldx, w + n0 * ldw, ldw, 0.0f, y + m0 * ldy + n0, ldy);
  };
  // Inside an OpenMP region oneDNN runs on the calling thread alone.
  if (tiles > 1 && OpenTeam(m * n * k >= kTeamMinWork)) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) tile(t);
    return;
  }
  const SingleThreadedBlas one_thread;
  for (int64_t t = 0; t < tiles; ++t) tile(t);
}

void SgemmXW(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float beta, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && ldx >= k && ldw >= n && ldy >= n);
  dnnl_status_t st = dnnl_sgemm('N', 'N', m, n, k, 1.0f, x, ldx, w, ldw, beta, y, ldy);
  NIBBLE_CHECK_MSG(st == dnnl_success, "dnnl_sgemm status %d", static_cast<int>(st));
}

void SgemmAtB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* y, int64_t ldy) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && lda >= m && ldb >= n && ldy >= n);
  dnnl_status_t st = dnnl_sgemm('T', 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, y, ldy);
  NIBBLE_CHECK_MSG(st == dnnl_success, "dnnl_sgemm status %d", static_cast<int>(st));
}

namespace {

// A bf16 matmul primitive for one (N, K) with M left to run time, or none (usable == false) when
// oneDNN would run its reference implementation, which is far slower than widening to fp32.
struct Bf16Matmul {
  bool usable = false;
  dnnl::matmul prim;
};

const Bf16Matmul& Bf16MatmulFor(const dnnl::engine& eng, int64_t n, int64_t k) {
  // Per thread (oneDNN primitives are not shared across threads here): one primitive per (N, K),
  // a few KB each; a model has a handful of shapes (and of tile widths, model/workspace.h).
  thread_local std::map<std::pair<int64_t, int64_t>, Bf16Matmul> cache;
  auto it = cache.find({n, k});
  if (it != cache.end()) return it->second;
  Bf16Matmul& mm = cache[{n, k}];
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  try {
    const md x({DNNL_RUNTIME_DIM_VAL, k}, dt::bf16, tag::ab);
    const md w({k, n}, dt::bf16, tag::ba);  // w[N,K] row-major is the K x N matrix in "ba" order
    const md y({DNNL_RUNTIME_DIM_VAL, n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x, w, y), eng);
    mm.usable = std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
    if (mm.usable) mm.prim = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
    mm.usable = false;
  }
  return mm;
}

// The engine of this thread's primitives (Bf16MatmulFor's cache): one per thread, a few hundred
// bytes; a primitive runs only on the engine it was made for.
const dnnl::engine& ThreadEngine() {
  thread_local dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Intel without AMX: oneDNN's bf16 matmul (vdpbf16ps at half the FMA rate) loses to the fp32
// sgemm on the same values widened, so it is reported unusable and the callers widen.
bool Bf16MatmulDeclined() { return ActiveW4Dispatch().kernels.bf16_prefill_sgemm; }

}  // namespace

bool GemmBf16Usable(int64_t n, int64_t k) {
  NIBBLE_CHECK(n > 0 && k > 0);
  return !Bf16MatmulDeclined() && Bf16MatmulFor(ThreadEngine(), n, k).usable;
}

bool DenseGemmHasAmx() {
  static const bool amx = (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & dnnl_cpu_isa_avx512_core_amx) ==
                          dnnl_cpu_isa_avx512_core_amx;
  return amx;
}

bool GemmBf16XWt(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* w, float* y) {
  NIBBLE_CHECK(m > 0 && n > 0 && k > 0 && x != nullptr && w != nullptr && y != nullptr);
  if (Bf16MatmulDeclined()) return false;
  const dnnl::engine& eng = ThreadEngine();
  thread_local dnnl::stream stream(eng);  // a few hundred bytes per thread
  const Bf16Matmul& mm = Bf16MatmulFor(eng, n, k);
  if (!mm.usable) return false;
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::memory xm(md({m, k}, dt::bf16, tag::ab), eng, const_cast<uint16_t*>(x));
  dnnl::memory wm(md({k, n}, dt::bf16, tag::ba), eng, const_cast<uint16_t*>(w));
  dnnl::memory ym(md({m, n}, dt::f32, tag::ab), eng, y);
  mm.prim.execute(stream, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
  stream.wait();
  return true;
}

}  // namespace nibble
