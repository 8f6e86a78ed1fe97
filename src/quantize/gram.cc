// XᵀX in fixed blocks (see gram.h).
#include "quantize/gram.h"

#include <algorithm>

#include "kernels/dense_gemm.h"

namespace nibble {

std::vector<float> GramMatrix(const float* x, int64_t rows, int64_t k, GramFill fill) {
  constexpr int64_t kCols = 64, kChunk = 2048;
  const int64_t blocks = (k + kCols - 1) / kCols;
  std::vector<float> g(static_cast<size_t>(k * k));
#pragma omp parallel
  {
    std::vector<float> part(static_cast<size_t>(k * kCols));
    std::vector<double> acc(part.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kCols, w = std::min(kCols, k - c0);
      const int64_t i0 = fill == GramFill::kFull ? 0 : c0, m = k - i0;  // rows i0.. of G's column block
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t r0 = 0; r0 < rows; r0 += kChunk) {
        const int64_t nr = std::min(kChunk, rows - r0);
        SgemmAtB(m, w, nr, x + r0 * k + i0, k, x + r0 * k + c0, k, 0.0f, part.data(), w);
        for (int64_t i = 0; i < m * w; ++i) acc[i] += part[i];
      }
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < w; ++j) g[(i0 + i) * k + c0 + j] = static_cast<float>(acc[i * w + j]);
    }
  }
  if (fill == GramFill::kLowerMirrored) MirrorLower(g.data(), k);
  return g;
}

void AccumulateGramLower(const float* x, int64_t rows, int64_t k, float* g) {
  constexpr int64_t kCols = 64;
  const int64_t blocks = (k + kCols - 1) / kCols;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kCols, w = std::min(kCols, k - c0);
    SgemmAtB(k - c0, w, rows, x + c0, k, x + c0, k, 1.0f, g + c0 * k + c0, k);
  }
}

void MirrorLower(float* g, int64_t k) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = i + 1; j < k; ++j) g[i * k + j] = g[j * k + i];
}

}  // namespace nibble
