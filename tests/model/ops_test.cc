// Vectorised element-wise ops against their scalar definitions (model/ops.h).
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/ops.h"

namespace nibble {
namespace {

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

TEST(Ops, ExpShiftedInPlaceIsBitIdenticalToExpF) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-100.f, 100.f);
  std::vector<float> x;
  for (int i = 0; i < 4099; ++i) x.push_back(d(rng));  // not a multiple of any vector width
  for (float v : {0.f, -0.f, -87.f, -87.5f, 88.f, 88.5f, 1e-30f, -1e-30f, 0.5f, -0.5f, 1e4f, -1e4f}) x.push_back(v);
  for (float shift : {0.f, -3.25f, 17.f}) {
    std::vector<float> y = x;
    ExpShiftedInPlace(y.data(), static_cast<int64_t>(y.size()), shift);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_TRUE(SameBits(y[i], ExpF(x[i] + shift))) << "x = " << x[i] << " shift = " << shift << ": " << y[i] << " vs "
                                                      << ExpF(x[i] + shift);
  }
}

TEST(Ops, SoftmaxAndSiluMatchTheirScalarFormulas) {
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.f, 4.f);
  for (int64_t n : {1, 7, 255, 256, 257, 1000}) {
    std::vector<float> row(static_cast<size_t>(n));
    for (auto& v : row) v = d(rng);
    // Softmax: max-subtracted ExpF, summed in index order, times 1/sum.
    std::vector<float> ref = row;
    float mx = ref[0];
    for (float v : ref) mx = v > mx ? v : mx;
    float sum = 0;
    for (auto& v : ref) {
      v = ExpF(v - mx);
      sum += v;
    }
    const float inv = 1.0f / sum;
    for (auto& v : ref) v *= inv;
    std::vector<float> got = row;
    SoftmaxRow(got.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(SameBits(got[i], ref[i])) << "softmax n=" << n << " i=" << i;

    // SiLU · up, also in place (a aliasing g).
    std::vector<float> u(static_cast<size_t>(n));
    for (auto& v : u) v = d(rng);
    std::vector<float> a(static_cast<size_t>(n)), g = row;
    SiluMul(row.data(), u.data(), n, a.data());
    SiluMul(g.data(), u.data(), n, g.data());
    for (int64_t i = 0; i < n; ++i) {
      const float want = row[i] / (1.0f + ExpF(-row[i])) * u[i];
      ASSERT_TRUE(SameBits(a[i], want)) << "silu n=" << n << " i=" << i;
      ASSERT_TRUE(SameBits(g[i], want)) << "silu in place n=" << n << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace nibble
