// Int4Linear against a dense linear on the same dequantized weights: GEMV (M = 1) and GEMM
// (M > 1) paths, bias added exactly once, and GEMV results independent of the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <tuple>

#include "formats/int4_matrix.h"
#include "model/int4_linear.h"
#include "model/linear.h"

namespace nibble {
namespace {

Int4Matrix RandomMatrix(int64_t n, int64_t k, int64_t g, bool sym, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = sym;
  m.codes.resize(n * k);
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng() & 15);
  std::uniform_real_distribution<float> s(0.001f, 0.05f);
  m.scales.resize(n * (k / g));
  for (auto& v : m.scales) v = s(rng);
  m.zero_points.resize(n * (k / g));
  for (auto& z : m.zero_points) z = sym ? 8 : static_cast<uint8_t>(rng() & 15);
  return m;
}

// Act-order: column k in group g_idx[k] (alternating groups, K = 256, g = 128). The dense oracle
// dequantizes through g_idx with its own loop; weight() gives the g_idx matrix back exactly.
TEST(Int4Linear, ActOrderGIdxRunsThroughItsGroups) {
  Int4Matrix w = RandomMatrix(40, 256, 128, false, 11);
  w.g_idx.resize(256);
  for (int64_t c = 0; c < 256; ++c) w.g_idx[c] = static_cast<int32_t>(c % 2);
  ASSERT_TRUE(ValidateInt4Matrix(w, "w").ok());
  EXPECT_FALSE(HasNaturalGroups(w));
  auto dense_w = std::make_shared<std::vector<float>>(40 * 256);
  for (int64_t r = 0; r < 40; ++r)
    for (int64_t c = 0; c < 256; ++c) {
      const int64_t gi = r * 2 + c % 2;
      (*dense_w)[r * 256 + c] = static_cast<float>(int{w.codes[r * 256 + c]} - int{w.zero_points[gi]}) * w.scales[gi];
    }
  std::vector<float> ref(40 * 256);
  DequantizeRef(w, ref.data());
  EXPECT_EQ(ref, *dense_w);
  DenseLinear dense(40, 256, dense_w, {});
  Int4Linear q(w, {}, "test");
  EXPECT_EQ(q.weight(), w);
  for (int64_t m : {1, 3, 70}) {
    std::vector<float> x(m * 256), y1(m * 40), y2(m * 40);
    std::mt19937 rng(static_cast<uint32_t>(m));
    std::normal_distribution<float> d(0, 1);
    for (auto& v : x) v = d(rng);
    dense.Forward(x.data(), m, y1.data());
    q.Forward(x.data(), m, y2.data());
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y1[i], y2[i], 1e-3) << "M=" << m << " element " << i;
  }
  // A group holding other than g columns is refused.
  w.g_idx[0] = 1;
  const Status bad = ValidateInt4Matrix(w, "layer");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("group_size = 128"), std::string::npos) << bad.error().message;
}

TEST(Int4Linear, MatchesDenseOnDequantizedWeightsWithBiasOnce) {
  for (int64_t m : {1, 2, 7}) {
    for (auto [n, k, g] : {std::tuple<int64_t, int64_t, int64_t>{65, 96, 32}, {130, 256, 128}, {9, 64, 64}}) {
      Int4Matrix w = RandomMatrix(n, k, g, m % 2 == 0, static_cast<uint32_t>(n * 31 + k + m));
      std::vector<float> bias(n);
      std::mt19937 rng(7);
      std::normal_distribution<float> d(0, 1);
      for (auto& b : bias) b = d(rng);
      std::vector<float> x(m * k);
      for (auto& v : x) v = d(rng);
      auto dense_w = std::make_shared<std::vector<float>>(n * k);
      DequantizeRef(w, dense_w->data());
      DenseLinear dense(n, k, dense_w, bias);
      Int4Linear q(w, bias, "test");
      std::vector<float> y1(m * n), y2(m * n);
      dense.Forward(x.data(), m, y1.data());
      q.Forward(x.data(), m, y2.data());
      double scale = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = std::fabs(bias[j]);
          for (int64_t kk = 0; kk < k; ++kk) s += std::fabs(x[i * k + kk] * (*dense_w)[j * k + kk]);
          scale = std::max(scale, s);
        }
      const double tol = 2.0 * (k + 2) * 1.2e-7 * scale;  // two fp32 sums of K terms, different order
      for (size_t i = 0; i < y1.size(); ++i)
        ASSERT_NEAR(y1[i], y2[i], tol) << "M=" << m << " N=" << n << " K=" << k << " element " << i;
    }
  }
}

TEST(Int4Linear, GemvIndependentOfThreadCount) {
  Int4Matrix w = RandomMatrix(1000, 256, 32, false, 3);
  Int4Linear q(w, {}, "test");
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  std::vector<float> a(1000), b(1000);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  q.Forward(x.data(), 1, a.data());
  omp_set_num_threads(2);
  q.Forward(x.data(), 1, b.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace nibble
