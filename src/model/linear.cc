#include "model/linear.h"

#include <algorithm>

#include "base/check.h"
#include "kernels/dense_gemm.h"

namespace nibble {

DenseLinear::DenseLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<float>> weight,
                         std::vector<float> bias)
    : n_(n), k_(k), weight_(std::move(weight)), bias_(std::move(bias)) {
  NIBBLE_CHECK(static_cast<int64_t>(weight_->size()) == n * k);
  NIBBLE_CHECK(bias_.empty() || static_cast<int64_t>(bias_.size()) == n);
}

void DenseLinear::Forward(const float* x, int64_t m, float* y, Workspace* /*ws*/) const {
  SgemmXWtTiled(m, n_, k_, x, k_, weight_->data(), k_, y, n_);
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

void Bf16DenseLinear::Forward(const float* x, int64_t m, float* y, Workspace* ws) const {
  const float* bias = bias_.empty() ? nullptr : bias_.data();
  Workspace local;
  Workspace& w = ws != nullptr ? *ws : local;
  if (m < kBf16GemvMaxRows) {
    x = AlignedRows(x, m * k_, w);
    if (m == 1) return GemvBf16(n_, k_, weight_->data(), x, bias, y, gemv_);
    // Batched decode: the GEMV per row on weight blocks held in cache, rather than widening the
    // whole matrix for a few rows.
    return GemvBf16Rows(m, n_, k_, weight_->data(), x, bias, y, gemv_);
  }
  // Tiles of whole rows widened in the caller's workspace: the scratch follows K, not N
  // (LinearTileRows), and each output element is the same sgemm dot product.
  const int64_t tile = LinearTileRows(n_, k_, 4, w.tile_bytes());
  float* const wide = w.Get<float>(Workspace::Slot::kLinearTile, tile * k_);
  for (int64_t n0 = 0; n0 < n_; n0 += tile) {
    const int64_t nt = std::min(tile, n_ - n0);
    Bf16ToF32Rows(weight_->data() + n0 * k_, nt, k_, wide);
    SgemmXWtTiled(m, nt, k_, x, k_, wide, k_, y + n0, n_);
  }
  if (bias != nullptr) AddBiasRows(y, m, n_, bias);
}

void AddBiasRows(float* y, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

}  // namespace nibble
