#include "model/linear.h"

#include "base/check.h"
#include "kernels/dense_gemm.h"

namespace nibble {

DenseLinear::DenseLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<float>> weight,
                         std::vector<float> bias)
    : n_(n), k_(k), weight_(std::move(weight)), bias_(std::move(bias)) {
  NIBBLE_CHECK(static_cast<int64_t>(weight_->size()) == n * k);
  NIBBLE_CHECK(bias_.empty() || static_cast<int64_t>(bias_.size()) == n);
}

void DenseLinear::Forward(const float* x, int64_t m, float* y) const {
  SgemmXWt(m, n_, k_, x, k_, weight_->data(), k_, 0.0f, y, n_);
  if (!bias_.empty()) AddBiasRows(y, m, n_, bias_.data());
}

void AddBiasRows(float* y, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

}  // namespace nibble
