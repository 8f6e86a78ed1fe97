// The Linear interface every weight access of the model goes through: Dense (fp32 weights) now,
// Int4 (native int4 layout, W4A32 kernels) for quantized checkpoints. y = x · Wᵀ + b, HF layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/bf16_gemv.h"
#include "model/workspace.h"

namespace nibble {

/// A linear layer y[M,N] = x[M,K] · W[N,K]ᵀ (+ bias[N]); N = out_features, K = in_features.
class Linear {
 public:
  virtual ~Linear() = default;
  virtual int64_t in_features() const = 0;   // K
  virtual int64_t out_features() const = 0;  // N
  /// x: [m, K] fp32 row-major; y: [m, N] fp32 row-major (overwritten). m >= 1. Only reads the
  /// linear: any number of threads may run Forward at once, each with its own `ws` (the caller's
  /// scratch, model/workspace.h); nullptr = a workspace of this call's own, freed on return.
  virtual void Forward(const float* x, int64_t m, float* y, Workspace* ws) const = 0;
  void Forward(const float* x, int64_t m, float* y) const { Forward(x, m, y, nullptr); }
  /// Short description for `inspect`, e.g. "dense f32" or "int4 uint4 g128".
  virtual std::string Describe() const = 0;
  /// Bytes of weight storage (excluding bias).
  virtual int64_t WeightBytes() const = 0;
  /// Opt-in W4A8: int4 linears whose group size the int8 kernels serve switch Forward to
  /// dynamically quantized int8 activations (kernels/int4_packed.h W4Int8Acts). Returns whether
  /// this linear now runs int8 activations (false for dense linears and unsupported group sizes).
  /// Not thread-safe against a concurrent Forward.
  virtual bool SetInt8Activations(bool on) {
    (void)on;
    return false;
  }
  /// Opt-in bf16 activations: int4 linears whose group size is a multiple of 32 switch Forward to
  /// activations rounded to bf16 (kernels/int4_packed.h W4Bf16Acts; W4A16 as a bf16 engine runs
  /// it). Returns whether this linear now runs bf16 activations (false for dense linears and
  /// unsupported group sizes). Not thread-safe against a concurrent Forward.
  virtual bool SetBf16Activations(bool on) {
    (void)on;
    return false;
  }
};

/// bf16 weights as bit patterns, [rows, cols] row-major: in memory, or zero-copy in a mapped
/// checkpoint (`owner` keeps the mapping alive), so a bf16 table is never resident twice.
struct Bf16Weights {
  std::shared_ptr<const void> owner;  // keeps `values` valid
  const uint16_t* values = nullptr;   // 2-byte aligned
  size_t count = 0;
  const uint16_t* data() const { return values; }
  size_t size() const { return count; }
  /// Owns `v`.
  static std::shared_ptr<const Bf16Weights> Of(std::shared_ptr<const std::vector<uint16_t>> v);
};

/// Rows of x that SgemmWidenedBf16 rounds at a time.
constexpr int64_t kWidenedRows = 512;

/// y[m, n] (row stride n) = x · Wᵀ through the tiled sgemm (kernels/dense_gemm.h) for a bf16 weight
/// handed over tile by tile: `tile(n0, nt)` returns rows [n0, n0 + nt) as bf16 bits, nt at most
/// LinearTileRows(n, k, 4, ws.tile_bytes()); each tile is widened exactly (Slot::kLinearTile). With
/// `round_x` the rows of x are rounded to bf16 first, kWidenedRows at a time (Slot::kLinearRowsWide:
/// a W4A16 engine's activations), else used as they are. No bias. The scratch follows K and the
/// tile budget, not M or N: the route of bf16 weights where no bf16 matmul serves.
void SgemmWidenedBf16(const float* x, int64_t m, int64_t n, int64_t k, bool round_x,
                      const std::function<const uint16_t*(int64_t n0, int64_t nt)>& tile, float* y, Workspace& ws);

/// Dense fp32 linear through the dense GEMM (oneDNN sgemm). Weights may be shared (tied
/// embeddings / lm_head).
class DenseLinear final : public Linear {
 public:
  /// weight: [N, K] fp32; bias: empty or [N].
  DenseLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<float>> weight, std::vector<float> bias);
  int64_t in_features() const override { return k_; }
  int64_t out_features() const override { return n_; }
  using Linear::Forward;
  void Forward(const float* x, int64_t m, float* y, Workspace* ws) const override;
  std::string Describe() const override { return "dense f32"; }
  int64_t WeightBytes() const override { return n_ * k_ * 4; }
  const float* weight() const { return weight_->data(); }

 private:
  int64_t n_, k_;
  std::shared_ptr<const std::vector<float>> weight_;
  std::vector<float> bias_;
};

/// Dense linear whose checkpoint stores bf16, kept as bf16 (2 bytes per weight instead of 4).
/// M = 1 (decode) runs the dispatched bf16 GEMV (kernels/bf16_gemv.h), which widens the weights
/// in registers; from kBf16GemvMaxRows rows on it widens them (exactly) in tiles of
/// LinearTileRows rows in the caller's workspace and runs the dense sgemm per tile, so prefill
/// and perplexity compute what DenseLinear on the widened matrix does.
/// Built by the loader only where the dispatch has a bf16 GEMV (AVX-512); elsewhere bf16 weights
/// are widened at load into a DenseLinear.
class Bf16DenseLinear final : public Linear {
 public:
  /// weight: [N, K] bf16 bit patterns, may be shared (a tied lm_head runs on the embedding
  /// table); bias: empty or [N]. `gemv` must be non-null.
  Bf16DenseLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<uint16_t>> weight, std::vector<float> bias,
                  Bf16GemvKernel gemv);
  /// The same on weights that may live in a mapped checkpoint (zero-copy).
  Bf16DenseLinear(int64_t n, int64_t k, std::shared_ptr<const Bf16Weights> weight, std::vector<float> bias,
                  Bf16GemvKernel gemv);
  int64_t in_features() const override { return k_; }
  int64_t out_features() const override { return n_; }
  using Linear::Forward;
  void Forward(const float* x, int64_t m, float* y, Workspace* ws) const override;
  std::string Describe() const override { return "dense bf16"; }
  int64_t WeightBytes() const override { return n_ * k_ * 2; }

 private:
  int64_t n_, k_;
  std::shared_ptr<const Bf16Weights> weight_;
  std::vector<float> bias_;
  Bf16GemvKernel gemv_;
};

/// Adds bias[N] to every row of y[M,N].
void AddBiasRows(float* y, int64_t m, int64_t n, const float* bias);

}  // namespace nibble
