// bf16-weight GEMV: scalar reference and threaded driver (see bf16_gemv.h).
#include "kernels/bf16_gemv.h"

#include <algorithm>
#include <cmath>

#include "base/half.h"
#include "base/parallel.h"
#include "kernels/aligned_acts.h"
#include "kernels/int4_dispatch.h"

namespace nibble {
namespace {

constexpr int64_t kBlockRows = 64;

}  // namespace

void GemvBf16Scalar(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0, int64_t n1) {
  for (int64_t r = n0; r < n1; ++r) {
    const uint16_t* row = w + r * k;
    float acc = 0.0f;
    for (int64_t i = 0; i < k; ++i) acc = std::fma(x[i], Bf16ToF32(row[i]), acc);
    y[r] = bias != nullptr ? acc + bias[r] : acc;
  }
}

void Bf16ToF32Rows(const uint16_t* w, int64_t n, int64_t k, float* out) {
  ParallelFor(n, n * k >= kTeamMinWork, [&](int64_t r) {
    for (int64_t i = 0; i < k; ++i) out[r * k + i] = Bf16ToF32(w[r * k + i]);
  });
}

void GemvBf16(int64_t n, int64_t k, const uint16_t* w, const float* x, const float* bias, float* y,
              Bf16GemvKernel kernel) {
  GemvBf16Rows(1, n, k, w, x, bias, y, kernel);
}

void GemvBf16Rows(int64_t m, int64_t n, int64_t k, const uint16_t* w, const float* x, const float* bias, float* y,
                  Bf16GemvKernel kernel) {
  if (n == 0 || m == 0) return;
  if (kernel == nullptr) kernel = ActiveW4Dispatch().kernels.gemv_bf16;
  if (n >= kBlockRows) x = AlignedActs(x, m * k);
  const int64_t nblocks = (n + kBlockRows - 1) / kBlockRows;
  ParallelFor(nblocks, nblocks > 1 && m * n * k >= kTeamMinWork, [&](int64_t b) {
    for (int64_t i = 0; i < m; ++i) kernel(k, w, x + i * k, bias, y + i * n, b * kBlockRows, std::min(n, (b + 1) * kBlockRows));
  });
}

}  // namespace nibble
