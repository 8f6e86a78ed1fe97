// GramMatrix (quantize/gram.h) against a double-precision XᵀX written here: fp32 inputs, and
// bf16-valued inputs (the bf16 matmul path, split into parts of 2k rows) at one and two threads.
#include <gtest/gtest.h>

#include <omp.h>

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

}  // namespace
