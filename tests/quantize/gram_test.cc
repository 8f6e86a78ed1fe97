// quantize/gram.h against a double-precision XᵀX written here: GramMatrix on fp32 inputs and on
// bf16-valued inputs (the bf16 matmul path, split into parts of 2k rows) at one and two threads,
// and the 16-bit calibration's chunked sum (AccumulateGramLower, MirrorLower): exactly symmetric
// and the same bits at one and two threads.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/float_dtype.h"
#include "quantize/gram.h"

namespace {

std::vector<float> RandomInputs(int64_t rows, int64_t k, bool bf16_valued, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const float v = d(rng) * (1.0f + static_cast<float>(c % 7));  // columns of different scale
      x[r * k + c] = bf16_valued ? nibble::RoundToDType(v, nibble::DType::kBF16) : v;
    }
  return x;
}

// Each entry of g against Σ x_ri x_rj in double, within 1e-5 of sqrt(G_ii G_jj) (the rounding
// of fp32 sums of 2048 products is far below that).
void ExpectNearReference(const std::vector<float>& g, const std::vector<float>& x, int64_t rows, int64_t k) {
  std::vector<double> ref(static_cast<size_t>(k * k), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) ref[i * k + j] += static_cast<double>(x[r * k + i]) * x[r * k + j];
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double scale = std::sqrt(ref[i * k + i] * ref[j * k + j]);
      ASSERT_NEAR(g[i * k + j], ref[i * k + j], 1e-5 * scale) << "G[" << i << "][" << j << "]";
    }
}

std::vector<float> GramAtThreads(int threads, const std::vector<float>& x, int64_t rows, int64_t k, nibble::GramFill f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<float> g = nibble::GramMatrix(x.data(), rows, k, f);
  omp_set_num_threads(before);
  return g;
}

TEST(GramMatrix, Fp32InputsMatchTheDoubleReferenceAndMirrorExactly) {
  const int64_t rows = 2500, k = 72;  // two chunks, a partial column block
  const std::vector<float> x = RandomInputs(rows, k, false, 1);
  const std::vector<float> full = nibble::GramMatrix(x.data(), rows, k, nibble::GramFill::kFull);
  ExpectNearReference(full, x, rows, k);
  const std::vector<float> low = nibble::GramMatrix(x.data(), rows, k, nibble::GramFill::kLowerMirrored);
  ExpectNearReference(low, x, rows, k);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) ASSERT_EQ(low[i * k + j], low[j * k + i]);
}

// bf16-valued inputs over several parts of 2k rows (k = 136: parts of 2048 rows, 5000 rows are
// two full chunks and a partial one): the reference's values, exactly symmetric when mirrored,
// and the same bytes at one and two threads.
TEST(GramMatrix, Bf16ValuedInputsMatchTheReferenceAtAnyThreadCount) {
  const int64_t rows = 5000, k = 136;
  const std::vector<float> x = RandomInputs(rows, k, true, 2);
  for (nibble::GramFill f : {nibble::GramFill::kFull, nibble::GramFill::kLowerMirrored}) {
    const std::vector<float> one = GramAtThreads(1, x, rows, k, f);
    const std::vector<float> two = GramAtThreads(2, x, rows, k, f);
    ExpectNearReference(two, x, rows, k);
    ASSERT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)));
    if (f == nibble::GramFill::kLowerMirrored) {
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < k; ++j) ASSERT_EQ(two[i * k + j], two[j * k + i]);
    }
  }
}


// x [rows, k]: correlated Gaussian columns with per-column scales over ~30x, bf16 values or not.
std::vector<float> GramTestInputs(int64_t rows, int64_t k, unsigned seed, bool bf16_valued = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    const float common = nd(rng);
    for (int64_t c = 0; c < k; ++c) x[r * k + c] = (nd(rng) + 0.5f * common) * (1.0f + static_cast<float>(c % 30));
  }
  if (bf16_valued)
    for (float& v : x) v = nibble::RoundToDType(v, nibble::DType::kBF16);
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

// The chunked sum against the double XᵀX and the whole-rows GramMatrix; exactly symmetric.
// bf16-valued inputs take the bf16 matmul where this CPU has a usable one.
void CheckChunkedGram(int64_t rows, int64_t k, bool bf16_valued) {
  const std::vector<float> x = GramTestInputs(rows, k, 7, bf16_valued);
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

TEST(Gram, ChunkedFp32SumMatchesADoubleReferenceAndIsSymmetric) {
  // One tile, then several with a short last one (k = 1100: tiles of 512); a short last chunk.
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{700, 150}, {300, 1100}}) {
    SCOPED_TRACE("k " + std::to_string(k));
    CheckChunkedGram(rows, k, false);
  }
}

TEST(Gram, ChunkedBf16ValuedSumMatchesADoubleReferenceAndIsSymmetric) {
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{700, 150}, {300, 1100}}) {
    SCOPED_TRACE("k " + std::to_string(k));
    CheckChunkedGram(rows, k, true);
  }
}

TEST(Gram, ChunkedSumIsTheSameAtOneAndTwoThreads) {
  const int64_t rows = 300, k = 1100;  // tiles of 512 claimed by either thread
  for (bool bf16_valued : {false, true}) {
    const std::vector<float> x = GramTestInputs(rows, k, 11, bf16_valued);
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    const std::vector<float> one = ChunkedGram(x, rows, k, 128);
    omp_set_num_threads(2);
    const std::vector<float> two = ChunkedGram(x, rows, k, 128);
    omp_set_num_threads(before);
    EXPECT_EQ(one, two) << (bf16_valued ? "bf16-valued" : "fp32");
  }
}

}  // namespace
