#include "model/int4_linear.h"

#include <algorithm>

#include "kernels/dense_gemm.h"
#include "kernels/int4_ref.h"

namespace nibble {

Int4Linear::Int4Linear(Int4Matrix weight, std::vector<float> bias, std::string desc)
    : w_(std::move(weight)), bias_(std::move(bias)), desc_(std::move(desc)) {}

int64_t Int4Linear::WeightBytes() const {
  return (w_.n * w_.k + 1) / 2 + w_.n * w_.groups() * 4 + (w_.n * w_.groups() + 1) / 2;
}

void Int4Linear::Forward(const float* x, int64_t m, float* y) const {
  if (m == 1) {
    // GEMV: output rows split across threads in fixed blocks; each row's sum is computed by one
    // thread in the same order, so the result does not depend on the thread count.
    const int64_t groups = w_.groups();
    const int64_t block = 64;
    const int64_t nblocks = (w_.n + block - 1) / block;
#pragma omp parallel for schedule(static)
    for (int64_t bi = 0; bi < nblocks; ++bi) {
      const int64_t j0 = bi * block;
      W4GemmArgs a;
      a.m = 1;
      a.n = std::min(block, w_.n - j0);
      a.k = w_.k;
      a.group_size = w_.group_size;
      a.x = x;
      a.codes = w_.codes.data() + j0 * w_.k;
      a.scales = w_.scales.data() + j0 * groups;
      a.zero_points = w_.zero_points.data() + j0 * groups;
      a.bias = bias_.empty() ? nullptr : bias_.data() + j0;
      a.y = y + j0;
      GemmW4A32Ref(a);
    }
    return;
  }
  thread_local std::vector<float> dense;
  dense.resize(static_cast<size_t>(w_.n * w_.k));
  DequantizeRef(w_, dense.data());
  SgemmXWt(m, w_.n, w_.k, x, w_.k, dense.data(), w_.k, 0.0f, y, w_.n);
  if (!bias_.empty()) AddBiasRows(y, m, w_.n, bias_.data());
}

}  // namespace nibble
