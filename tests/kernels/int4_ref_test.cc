// GemmW4A32Ref against a double-precision matmul of formats' DequantizeRef output, on tail shapes,
// with a tolerance derived from K and the magnitudes (DESIGN.md "reference with a derived
// tolerance"); plus exact small cases.
#include "kernels/int4_ref.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/int4_matrix.h"
#include "test_util.h"

namespace nibble {
namespace {

Int4Matrix RandomMatrix(std::mt19937& rng, int64_t n, int64_t k, int64_t g, bool sym) {
  return nibble_test::RandomInt4Matrix(rng, n, k, g, sym);
}

W4GemmArgs Args(const Int4Matrix& w, int64_t m, const float* x, const float* bias, float* y) {
  W4GemmArgs a;
  a.m = m;
  a.n = w.n;
  a.k = w.k;
  a.group_size = w.group_size;
  a.x = x;
  a.codes = w.codes.data();
  a.scales = w.scales.data();
  a.zero_points = w.zero_points.data();
  a.bias = bias;
  a.y = y;
  return a;
}

// Checks y against y_ref = x · Wᵀ + b computed in double from the dequantized W. Each output is an
// fp32 sum of K products plus a bias: |error| ≤ γ_{K+2} · (Σ_k |x_k w_k| + |b|), γ_n = n·u / (1 − n·u),
// u = 2^-24 (products and each addition round once; W itself is bit-identical in both paths).
void CheckAgainstDense(const Int4Matrix& w, int64_t m, const std::vector<float>& x, const std::vector<float>* bias,
                       const std::vector<float>& y, const std::string& label) {
  std::vector<float> wd(static_cast<size_t>(w.n * w.k));
  DequantizeRef(w, wd.data());
  const double gamma = nibble_test::Fp32Gamma(w.k + 2);
  double worst_ratio = 0;
  int64_t worst_i = -1, worst_j = -1;
  double worst_ref = 0, worst_tol = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < w.k; ++k) {
        const double p = static_cast<double>(x[i * w.k + k]) * wd[j * w.k + k];
        ref += p;
        mag += std::fabs(p);
      }
      if (bias) {
        ref += (*bias)[j];
        mag += std::fabs((*bias)[j]);
      }
      const double tol = gamma * mag + 1e-30;
      const double err = std::fabs(y[i * w.n + j] - ref);
      if (err / tol > worst_ratio) {
        worst_ratio = err / tol;
        worst_i = i;
        worst_j = j;
        worst_ref = ref;
        worst_tol = tol;
      }
    }
  }
  EXPECT_LE(worst_ratio, 1.0) << label << ": worst element y[" << worst_i << "][" << worst_j << "] = "
                              << y[worst_i * w.n + worst_j] << ", reference " << worst_ref << ", tolerance " << worst_tol;
}

TEST(GemmW4A32RefTest, MatchesDenseReferenceOnTailShapes) {
  std::mt19937 rng(42);
  std::normal_distribution<float> xd(0.f, 1.f);
  int cases = 0;
  for (int64_t m : {1, 2, 5}) {
    for (int64_t n : {1, 7, 8, 9, 63, 65}) {
      for (int64_t g : {32, 128}) {
        for (int64_t kmul : {1, 3}) {
          for (bool sym : {false, true}) {
            const int64_t k = g * kmul;
            const Int4Matrix w = RandomMatrix(rng, n, k, g, sym);
            std::vector<float> x(static_cast<size_t>(m * k));
            for (auto& v : x) v = xd(rng);
            std::vector<float> bias(static_cast<size_t>(n));
            for (auto& v : bias) v = xd(rng);
            const bool with_bias = (cases % 2) == 0;
            std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
            GemmW4A32Ref(Args(w, m, x.data(), with_bias ? bias.data() : nullptr, y.data()));
            CheckAgainstDense(w, m, x, with_bias ? &bias : nullptr, y,
                              "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                  " g=" + std::to_string(g) + (sym ? " sym" : " asym") + (with_bias ? " bias" : ""));
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 6 * 2 * 2 * 2);
}

TEST(GemmW4A32RefTest, PerChannelGroupEqualsK) {
  std::mt19937 rng(7);
  const Int4Matrix w = RandomMatrix(rng, 9, 96, 96, false);
  std::vector<float> x(2 * 96);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  std::vector<float> y(2 * 9);
  GemmW4A32Ref(Args(w, 2, x.data(), nullptr, y.data()));
  CheckAgainstDense(w, 2, x, nullptr, y, "per-channel");
}

TEST(GemmW4A32RefTest, ExactSmallCase) {
  // TV-1 codes (SPEC §7): with unit-vector inputs y = one column of W, exactly.
  Int4Matrix w;
  w.n = 2;
  w.k = 16;
  w.group_size = 8;
  w.codes = {0, 1, 2, 4, 6, 8, 12, 15, 2, 4, 6, 8, 10, 12, 14, 15, 0, 2, 4, 6, 8, 10, 12, 15, 0, 3, 7, 11, 15, 14, 13, 9};
  w.zero_points = {4, 0, 8, 15};
  w.scales = {0.25f, 0.25f, 0.25f, 0.25f};
  const float wt[2][16] = {{-1.0f, -0.75f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 2.75f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f, 3.75f},
                           {-2.0f, -1.5f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.75f, -3.75f, -3.0f, -2.0f, -1.0f, 0.0f, -0.25f, -0.5f, -1.5f}};
  std::vector<float> x(16 * 16, 0.0f);
  for (int i = 0; i < 16; ++i) x[i * 16 + i] = 1.0f;
  const std::vector<float> bias = {10.0f, -20.0f};
  std::vector<float> y(16 * 2);
  GemmW4A32Ref(Args(w, 16, x.data(), bias.data(), y.data()));
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(y[i * 2 + 0], wt[0][i] + 10.0f) << i;
    EXPECT_EQ(y[i * 2 + 1], wt[1][i] - 20.0f) << i;
  }
  // All-ones input: row sums.
  std::vector<float> ones(16, 1.0f), y1(2);
  GemmW4A32Ref(Args(w, 1, ones.data(), nullptr, y1.data()));
  EXPECT_EQ(y1[0], 21.75f);   // sum of row 0
  EXPECT_EQ(y1[1], -13.75f);  // sum of row 1
}

TEST(GemmW4A32RefTest, EmptyExtentsLeaveOutputUntouched) {
  Int4Matrix w;
  w.n = 3;
  w.k = 8;
  w.group_size = 8;
  w.codes.assign(24, 9);
  w.zero_points.assign(3, 8);
  w.scales.assign(3, 1.0f);
  std::vector<float> y(3, 123.0f);
  GemmW4A32Ref(Args(w, 0, nullptr, nullptr, y.data()));
  EXPECT_EQ(y, std::vector<float>(3, 123.0f));
}

TEST(GemmW4A32RefDeathTest, BrokenContractAborts) {
  Int4Matrix w;
  w.n = 1;
  w.k = 24;
  w.group_size = 16;  // 24 % 16 != 0
  w.codes.assign(24, 0);
  w.zero_points.assign(1, 0);
  w.scales.assign(1, 1.0f);
  std::vector<float> x(24), y(1);
  EXPECT_DEATH(GemmW4A32Ref(Args(w, 1, x.data(), nullptr, y.data())), "internal check failed");
}

}  // namespace
}  // namespace nibble
