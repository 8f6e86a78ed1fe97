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

std::shared_ptr<const Bf16Weights> Bf16Weights::Of(std::shared_ptr<const std::vector<uint16_t>> v) {
  if (v == nullptr) return nullptr;
  auto w = std::make_shared<Bf16Weights>();
  w->values = v->data();
  w->count = v->size();
  w->owner = std::move(v);
  return w;
}

Bf16DenseLinear::Bf16DenseLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<uint16_t>> weight,
                                 std::vector<float> bias, Bf16GemvKernel gemv)
    : Bf16DenseLinear(n, k, Bf16Weights::Of(std::move(weight)), std::move(bias), gemv) {}

Bf16DenseLinear::Bf16DenseLinear(int64_t n, int64_t k, std::shared_ptr<const Bf16Weights> weight,
                                 std::vector<float> bias, Bf16GemvKernel gemv)
    : n_(n), k_(k), weight_(std::move(weight)), bias_(std::move(bias)), gemv_(gemv) {
  NIBBLE_CHECK(weight_ != nullptr && static_cast<int64_t>(weight_->size()) == n * k && gemv_ != nullptr);
  NIBBLE_CHECK(bias_.empty() || static_cast<int64_t>(bias_.size()) == n);
}

void Bf16DenseLinear::Forward(const float* x, int64_t m, float* y) const {
  const float* bias = bias_.empty() ? nullptr : bias_.data();
  if (m == 1) return GemvBf16(n_, k_, weight_->data(), x, bias, y, gemv_);
  // Batched decode: the GEMV per row on weight blocks held in cache, rather than widening the
  // whole matrix for a few rows.
  if (m < kBf16GemvMaxRows) return GemvBf16Rows(m, n_, k_, weight_->data(), x, bias, y, gemv_);
  // Scratch reused across calls and layers of this thread (grows to the largest matrix).
  thread_local std::vector<float> wide;
  if (wide.size() < static_cast<size_t>(n_ * k_)) wide.resize(static_cast<size_t>(n_ * k_));
  Bf16ToF32Rows(weight_->data(), n_, k_, wide.data());
  SgemmXWt(m, n_, k_, x, k_, wide.data(), k_, 0.0f, y, n_);
  if (bias != nullptr) AddBiasRows(y, m, n_, bias);
}

void AddBiasRows(float* y, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

}  // namespace nibble
