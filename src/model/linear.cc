#include "model/linear.h"

#include <algorithm>

#include "base/check.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_packed.h"

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
  const uint16_t* const wb = weight_->data();
  SgemmWidenedBf16(x, m, n_, k_, false, [&](int64_t n0, int64_t) { return wb + n0 * k_; }, y, w);
  if (bias != nullptr) AddBiasRows(y, m, n_, bias);
}

void SgemmWidenedBf16(const float* x, int64_t m, int64_t n, int64_t k, bool round_x,
                      const std::function<const uint16_t*(int64_t n0, int64_t nt)>& tile, float* y, Workspace& ws) {
  const int64_t rows = LinearTileRows(n, k, 4, ws.tile_bytes());
  float* const wide = ws.Get<float>(Workspace::Slot::kLinearTile, rows * k);
  // x as it is, or rounded once when one block holds it, else per block and tile (the rounding
  // is 1 / nt of the tile's multiply-adds).
  const int64_t block = round_x ? std::min(m, kWidenedRows) : m;
  float* const xr = round_x ? ws.Get<float>(Workspace::Slot::kLinearRowsWide, block * k) : nullptr;
  if (round_x && block == m) RoundToBf16(x, m * k, xr);
  for (int64_t n0 = 0; n0 < n; n0 += rows) {
    const int64_t nt = std::min(rows, n - n0);
    Bf16ToF32Rows(tile(n0, nt), nt, k, wide);
    for (int64_t r0 = 0; r0 < m; r0 += block) {
      const int64_t mr = std::min(block, m - r0);
      if (round_x && block < m) RoundToBf16(x + r0 * k, mr * k, xr);
      SgemmXWtTiled(mr, nt, k, round_x ? xr : x + r0 * k, k, wide, k, y + r0 * n + n0, n);
    }
  }
}

void AddBiasRows(float* y, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

}  // namespace nibble
