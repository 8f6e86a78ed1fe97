// The Gram matrix of a 16-bit calibration's chunked fp pass (quantize/gram.h AccumulateGramLower):
// the fp32 sum over chunks of rows against a double-precision XᵀX written here, exactly symmetric
// after MirrorLower, and the same bits at one and two threads.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "quantize/gram.h"

namespace {

// x [rows, k]: correlated Gaussian columns with per-column scales over ~30x.
std::vector<float> GramTestInputs(int64_t rows, int64_t k, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    const float common = nd(rng);
    for (int64_t c = 0; c < k; ++c) x[r * k + c] = (nd(rng) + 0.5f * common) * (1.0f + static_cast<float>(c % 30));
  }
  return x;
}

// G += XᵀX over chunks of `chunk` rows in order, then mirrored.
std::vector<float> ChunkedGram(const std::vector<float>& x, int64_t rows, int64_t k, int64_t chunk) {
  std::vector<float> g(static_cast<size_t>(k * k), 0.0f);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk)
    nibble::AccumulateGramLower(x.data() + r0 * k, std::min(chunk, rows - r0), k, g.data());
  nibble::MirrorLower(g.data(), k);
  return g;
}

TEST(Gram, ChunkedFp32SumMatchesADoubleReferenceAndIsSymmetric) {
  const int64_t rows = 700, k = 150;  // k not a multiple of the 64-column blocks; a short last chunk
  const std::vector<float> x = GramTestInputs(rows, k, 7);
  const std::vector<float> g = ChunkedGram(x, rows, k, 256);
  double worst = 0;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double ref = 0, mag = 0;
      for (int64_t r = 0; r < rows; ++r) {
        ref += static_cast<double>(x[r * k + i]) * x[r * k + j];
        mag += std::fabs(static_cast<double>(x[r * k + i]) * x[r * k + j]);
      }
      worst = std::max(worst, std::fabs(g[i * k + j] - ref) / mag);
      ASSERT_EQ(g[i * k + j], g[j * k + i]) << i << ", " << j;
    }
  EXPECT_LT(worst, 1e-5) << "fp32 chunk sums against the double XᵀX, relative to Σ|x_i x_j|";
  // The whole-rows GramMatrix agrees to fp32 rounding.
  const std::vector<float> whole = nibble::GramMatrix(x.data(), rows, k, nibble::GramFill::kLowerMirrored);
  for (int64_t i = 0; i < k * k; ++i) ASSERT_NEAR(g[i], whole[i], 1e-4 * std::fabs(whole[i]) + 1e-2) << i;
}

TEST(Gram, ChunkedSumIsTheSameAtOneAndTwoThreads) {
  const int64_t rows = 600, k = 200;
  const std::vector<float> x = GramTestInputs(rows, k, 11);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = ChunkedGram(x, rows, k, 128);
  omp_set_num_threads(2);
  const std::vector<float> two = ChunkedGram(x, rows, k, 128);
  omp_set_num_threads(before);
  EXPECT_EQ(one, two);
}

}  // namespace
