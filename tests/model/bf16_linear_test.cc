// Bf16DenseLinear against DenseLinear on the widened weights: M > 1 bit-identical (same sgemm on
// the same fp32 matrix), M = 1 (the bf16 GEMV) within the fp32 summation bound; bias once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/int4_dispatch.h"
#include "model/linear.h"

namespace nibble {
namespace {

TEST(Bf16DenseLinear, MatchesDenseOnTheWidenedWeights) {
  std::vector<Bf16GemvKernel> kernels = {GemvBf16Scalar};
  if (ActiveW4Dispatch().kernels.gemv_bf16 != nullptr) kernels.push_back(ActiveW4Dispatch().kernels.gemv_bf16);
  std::mt19937 rng(21);
  std::normal_distribution<float> d(0.f, 1.f);
  const int64_t n = 67, k = 200;
  std::vector<uint16_t> w(static_cast<size_t>(n * k));
  auto wide = std::make_shared<std::vector<float>>(static_cast<size_t>(n * k));
  for (size_t i = 0; i < w.size(); ++i) {
    const float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    w[i] = static_cast<uint16_t>(u >> 16);
    u = static_cast<uint32_t>(w[i]) << 16;
    std::memcpy(&(*wide)[i], &u, 4);
  }
  std::vector<float> bias(static_cast<size_t>(n));
  for (auto& b : bias) b = d(rng);
  DenseLinear dense(n, k, wide, bias);
  for (Bf16GemvKernel kern : kernels) {
    Bf16DenseLinear lin(n, k, std::make_shared<const std::vector<uint16_t>>(w), bias, kern);
    EXPECT_EQ(lin.WeightBytes(), n * k * 2);
    // Below kBf16GemvMaxRows rows: the GEMV per row (each row as it is alone, within the fp32
    // bound of the dense product); from there the widened matrix through the dense GEMM.
    for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{9}, kBf16GemvMaxRows + 1}) {
      std::vector<float> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = d(rng);
      std::vector<float> y1(static_cast<size_t>(m * n)), y2(static_cast<size_t>(m * n));
      dense.Forward(x.data(), m, y1.data());
      lin.Forward(x.data(), m, y2.data());
      if (m >= kBf16GemvMaxRows) {
        EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << "M=" << m;
        continue;
      }
      for (int64_t i = 0; i < m; ++i) {
        std::vector<float> alone(static_cast<size_t>(n));
        lin.Forward(x.data() + i * k, 1, alone.data());
        EXPECT_EQ(std::memcmp(alone.data(), y2.data() + i * n, alone.size() * 4), 0) << "M=" << m << " row " << i;
        for (int64_t r = 0; r < n; ++r) {
          double mag = std::fabs(bias[r]);
          for (int64_t j = 0; j < k; ++j) mag += std::fabs(x[i * k + j] * (*wide)[r * k + j]);
          ASSERT_NEAR(y1[i * n + r], y2[i * n + r], 2.0 * (k + 2) * 6e-8 * mag) << "M=" << m << " row " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace nibble
