// The tiled sgemm of the model's linears (kernels/dense_gemm.h SgemmXWtTiled): the same bits for
// 1, 2 and 3 threads at shapes where oneDNN's threaded sgemm rounds by the thread count, close
// to a double-precision product, and a grid that covers the output once; where the bf16 matmul
// is declined.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/dense_gemm.h"
#include "kernels/int4_dispatch.h"

namespace nibble {
namespace {

std::vector<float> Random(std::mt19937& rng, int64_t count) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = d(rng);
  return v;
}

class ThreadsGuard {
 public:
  ThreadsGuard() : saved_(omp_get_max_threads()) {}
  ~ThreadsGuard() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

struct Shape {
  int64_t m, n, k;
};

TEST(SgemmXWtTiled, SameBitsForOneTwoAndThreeThreadsAndCloseToDouble) {
  const ThreadsGuard guard;
  std::mt19937 rng(7);
  // The first is a prefill of a 2048-wide linear (oneDNN's threaded sgemm gives other bits on
  // 2 threads there); the others cut tiles short in both directions; m = 1 is a decode row.
  for (const Shape s : {Shape{64, 2048, 2048}, Shape{300, 1100, 700}, Shape{1, 1500, 300}, Shape{130, 96, 64}}) {
    const std::vector<float> x = Random(rng, s.m * s.k), w = Random(rng, s.n * s.k);
    std::vector<float> one(static_cast<size_t>(s.m * s.n), NAN);
    omp_set_num_threads(1);
    SgemmXWtTiled(s.m, s.n, s.k, x.data(), s.k, w.data(), s.k, one.data(), s.n);
    for (int64_t i = 0; i < s.m; i += 7)
      for (int64_t j = 0; j < s.n; j += 5) {
        double want = 0;
        for (int64_t c = 0; c < s.k; ++c) want += double(x[i * s.k + c]) * w[j * s.k + c];
        ASSERT_NEAR(one[i * s.n + j], want, 1e-4 * std::sqrt(double(s.k)) * 4) << i << "," << j;
      }
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> got(one.size(), NAN);
      SgemmXWtTiled(s.m, s.n, s.k, x.data(), s.k, w.data(), s.k, got.data(), s.n);
      EXPECT_EQ(std::memcmp(got.data(), one.data(), one.size() * sizeof(float)), 0)
          << s.m << "x" << s.n << "x" << s.k << " on " << threads << " threads";
    }
  }
}

TEST(SgemmXWtTiled, WritesIntoWiderRowsAndLeavesTheRestAlone) {
  std::mt19937 rng(3);
  const int64_t m = 140, n = 600, k = 40, ldy = 650;
  const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
  std::vector<float> y(static_cast<size_t>(m * ldy), -5.f), dense(static_cast<size_t>(m * n));
  SgemmXWtTiled(m, n, k, x.data(), k, w.data(), k, y.data(), ldy);
  SgemmXWtTiled(m, n, k, x.data(), k, w.data(), k, dense.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    EXPECT_EQ(std::memcmp(&y[i * ldy], &dense[i * n], n * sizeof(float)), 0) << "row " << i;
    for (int64_t j = n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -5.f) << i << "," << j;
  }
}

// On Intel without AMX (W4Kernels::bf16_prefill_sgemm) oneDNN's bf16 matmul is declined, so the
// bf16 calibration GEMMs widen onto the sgemm; elsewhere it runs where oneDNN has a kernel.
TEST(GemmBf16XWt, DeclinedExactlyWhereBf16PrefillTakesTheSgemm) {
  const bool declined = ActiveW4Dispatch().kernels.bf16_prefill_sgemm;
  if (declined) {
    EXPECT_FALSE(GemmBf16Usable(256, 128));
  }
  const std::vector<uint16_t> x(4 * 128, 0x3f80), w(256 * 128, 0x3f80);  // bf16 1.0
  std::vector<float> y(4 * 256, -1.f);
  const bool ran = GemmBf16XWt(4, 256, 128, x.data(), w.data(), y.data());
  EXPECT_EQ(ran, GemmBf16Usable(256, 128));
  if (declined) {
    EXPECT_FALSE(ran);
  }
  for (float v : y) ASSERT_EQ(v, ran ? 128.f : -1.f);  // nothing written when declined
}

TEST(SgemmTilesFor, CoversTheOutputWithTilesFixedByTheShape) {
  for (const Shape s : {Shape{1, 32000, 0}, Shape{512, 2048, 0}, Shape{512, 256, 0}, Shape{2048, 14336, 0},
                        Shape{37, 100, 0}, Shape{4096, 4096, 0}}) {
    const SgemmTileGrid g = SgemmTilesFor(s.m, s.n);
    EXPECT_GE(g.rows * g.m_tiles, s.m);
    EXPECT_LT(g.rows * (g.m_tiles - 1), s.m);
    EXPECT_GE(g.cols * g.n_tiles, s.n);
    EXPECT_LT(g.cols * (g.n_tiles - 1), s.n);
    EXPECT_LE(g.cols, 512);
    EXPECT_GE(g.rows, std::min<int64_t>(s.m, 128));
    // Enough tiles to share, unless the rows are already at their floor or cover m.
    if (g.rows > 128 && g.rows < s.m) {
      EXPECT_GE(g.m_tiles * g.n_tiles, 8) << s.m << "x" << s.n;
    }
  }
  EXPECT_EQ(SgemmTilesFor(512, 2048).rows, 256);  // 4 column tiles: row blocks halved once
  EXPECT_EQ(SgemmTilesFor(512, 256).rows, 128);
  EXPECT_EQ(SgemmTilesFor(512, 5632).rows, 512);
}

}  // namespace
}  // namespace nibble
