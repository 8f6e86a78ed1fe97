// Int4 linear: weights in the kernels' packed layout W4P (kernels/int4_packed.h, docs/KERNELS.md),
// built once at load from the native Int4Matrix; fp32 activations (W4A32 numerics) unless the
// int8-activation path (SetInt8Activations, W4A8) or bf16-activation path
// (SetBf16Activations) is switched on.
//
// Kernels (dispatched per ISA, kernels/int4_dispatch.h): M < kDequantGemmMinRows runs the fused
// W4A32 GEMV/GEMM directly on the packed codes; larger M dequantizes the weight in tiles of rows
// (LinearTileRows, model/workspace.h) into the caller's workspace (exact values) and runs the
// dense GEMM (oneDNN) per tile, amortising the dequantization over M rows. Every scratch buffer
// is the caller's Workspace: Forward only reads the linear. Only the packed bytes are kept (0.5 B
// per weight + 4–5 B per group when g divides or is a multiple of 128); weight() rebuilds the
// unpacked Int4Matrix on demand (tests, export). A weight whose g_idx is not the natural one
// (act-order) is stored with its columns sorted by group, and Forward gathers each input row
// into that order first (one pass over M x K floats).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/page_buffer.h"
#include "formats/int4_matrix.h"
#include "kernels/int4_packed.h"
#include "model/linear.h"

namespace nibble {

class Int4Linear final : public Linear {
 public:
  /// From this many rows on, Forward dequantizes + runs the dense GEMM instead of the fused kernel.
  static constexpr int64_t kDequantGemmMinRows = 64;
  /// With bf16 activations, from this many rows on Forward dequantizes a weight of group size
  /// `group_size` to bf16 and runs oneDNN's bf16 matmul instead of the fused bf16 kernels:
  /// kBf16MatmulMinRowsAmxTiles where the AMX tile kernel serves g (a multiple of 128; it reads
  /// the packed weight once per 16 rows and skips the dequantized copy), else 16 where oneDNN has
  /// AMX tiles, else kBf16MatmulMinRowsNoAmx (the fused blocks and the AVX-512 BF16 matmul run on
  /// the same vdpbf16ps units, and the blocks skip the dequantized copy; docs/PERFORMANCE.md).
  static int64_t Bf16MatmulMinRows(int64_t group_size = 128);
  static constexpr int64_t kBf16MatmulMinRowsAmxTiles = 96;
  static constexpr int64_t kBf16MatmulMinRowsAmx = 16;
  static constexpr int64_t kBf16MatmulMinRowsNoAmx = 64;

  /// Where a linear's packed bytes go: a buffer of exactly `bytes` bytes, contents unspecified
  /// (the packers write every byte). Empty: owned memory on huge pages (PageBuffer). The
  /// packed-weight cache (model/weight_cache.h) hands out pages of its file instead.
  using PackedAllocator = std::function<PageBuffer(size_t bytes)>;

  /// `desc` describes the stored scheme for inspect (e.g. "uint4 per_group g128").
  /// weight: satisfies ValidateInt4Matrix (aborts otherwise); bias: empty or [N]. `desc` says
  /// "act-order" when the columns were reordered.
  Int4Linear(const Int4Matrix& weight, std::vector<float> bias, std::string desc, const PackedAllocator& alloc = {});
  /// A copy of bytes already in the W4P layout (e.g. benchmarks copying one packed matrix many
  /// times). packed: W4PackedBytes(geometry...) bytes; geometry.data is ignored.
  Int4Linear(const uint8_t* packed, size_t bytes, const W4PackedWeight& geometry, std::vector<float> bias,
             std::string desc);
  /// Packs a module straight from its stored transposed nibble words (DeferredInt4: `d.matrix`
  /// without codes), with no one-byte-per-code copy: eight stored words become eight W4P dwords
  /// by one 8 x 8 nibble transpose. The same bytes as the constructor on the decoded matrix.
  /// nullptr when the shape is not served this way (N % 8, K % 128 or g % 16 not 0; a g_idx):
  /// decode the codes and use the constructor.
  static std::unique_ptr<Int4Linear> FromTransposed(const DeferredInt4& d, std::vector<float> bias, std::string desc,
                                                    const PackedAllocator& alloc = {});
  /// A linear over bytes already packed by one of the above (a mapped cache file): `packed` holds
  /// W4PackedBytes(n, k, group_size, symmetric) bytes; `column_order` is what column_order() of
  /// the packing linear returned. Aborts on a size mismatch (the cache checks before).
  static std::unique_ptr<Int4Linear> FromPacked(PageBuffer packed, int64_t n, int64_t k, int64_t group_size, bool symmetric,
                                                std::vector<int32_t> column_order, std::vector<float> bias,
                                                std::string desc);
  int64_t in_features() const override { return pw_.k; }
  int64_t out_features() const override { return pw_.n; }
  using Linear::Forward;
  void Forward(const float* x, int64_t m, float* y, Workspace* ws) const override;
  std::string Describe() const override { return desc_; }
  /// W4A8 opt-in (Linear::SetInt8Activations): Forward quantizes each row of x to int8 per
  /// 128-value block (QuantizeActsInt8) and runs the int8 GEMV row by row for every M. Served
  /// when g is 32, 64 or a multiple of 128 (W4Int8Supported); otherwise stays W4A32.
  bool SetInt8Activations(bool on) override;
  /// bf16 activations (Linear::SetBf16Activations): Forward rounds each row of x to bf16. Below
  /// Bf16MatmulMinRows() rows it runs the AVX-512 BF16 kernels on the exact weights (PrepareActsBf16;
  /// CPUs without them: the W4A32 path on the rounded rows); from there on the weight is
  /// dequantized to bf16 and multiplied in oneDNN's bf16 matmul (the fp32 GEMM on the same bf16
  /// values where oneDNN has none), as a W4A16 engine's GEMM does; where the dispatch sets
  /// bf16_prefill_sgemm (Intel without AMX) the rounded rows go through the W4A32 path (exact
  /// weights, fp32 sgemm) instead. Served when g is a multiple of
  /// 32 (W4Bf16Supported); otherwise stays W4A32. Switching one opt-in on switches the other off.
  bool SetBf16Activations(bool on) override;
  /// With bf16 activations on: whether Forward of `m` rows runs the AVX-512 BF16 / AMX kernels
  /// (true) or not (false: no such kernel on this CPU, or m >= Bf16MatmulMinRows(g)).
  bool Bf16KernelServes(int64_t m) const;
  /// How Forward of m rows (in input order) runs: the fused kernels on the packed codes, the rows
  /// prepared one way (fp32, rounded to bf16, int8, the bf16 kernels' rows), or a GEMM over
  /// dequantized weight tiles (fp32 on fp32 or bf16-rounded rows, the bf16 matmul).
  enum class Route {
    kFusedFp32, kFusedRoundedBf16, kFusedInt8, kFusedBf16,  // the fused kernels
    kDenseFp32, kDenseRoundedBf16, kBf16Matmul,             // dequantized tiles
  };
  Route RouteFor(int64_t m) const;
  /// Bytes of the packed weight actually held (W4PackedBytes): for g = 128, 68/128 B per weight
  /// symmetric and 69/128 asymmetric.
  int64_t WeightBytes() const override { return static_cast<int64_t>(packed_.size()); }
  /// The unpacked native layout, rebuilt from the packed bytes (exact round trip, g_idx included).
  Int4Matrix weight() const;
  /// The packed weight (view into this object).
  const W4PackedWeight& packed() const { return pw_; }
  /// Reads the packed weight from `same_bytes` from now on: a copy of packed()'s bytes elsewhere
  /// (the cache file's pages once written). Aborts on a size mismatch.
  void MovePacked(PageBuffer same_bytes);
  /// Act-order: column j of the packed weight is input column_order()[j]; empty = identity.
  const std::vector<int32_t>& column_order() const { return perm_; }

 private:
  Int4Linear(PageBuffer packed, const W4PackedWeight& geometry, std::vector<float> bias, std::string desc);
  PageBuffer packed_;  // [N, K/g] group records (kernels/int4_packed.h), on huge pages when large
  W4PackedWeight pw_;            // geometry + pointer into packed_
  std::vector<float> bias_;
  std::string desc_;
  std::vector<int32_t> perm_;  // column j of the packed weight is input perm_[j]; empty = identity
  bool int8_ = false;
  bool bf16_ = false;
  // The dense W4A32 path: exact weights a tile of rows at a time through the fp32 GEMM.
  void ForwardDenseW4A32(const float* x, int64_t m, float* y, Workspace& ws) const;
  // bf16 activations at M >= Bf16MatmulMinRows(): bf16 weights and rows through the bf16 matmul.
  void ForwardBf16Matmul(const float* x, int64_t m, float* y, Workspace& ws) const;
  void ForwardInOrder(const float* x, int64_t m, float* y, Workspace& ws) const;
  friend void ForwardSameInput(const Linear* const* ls, float* const* ys, int64_t count, const float* x, int64_t m,
                               Workspace& ws);
};

/// ys[i] = ls[i]·x for `count` linears reading one input x[m, K] (attention's q / k / v, the
/// MLP's gate / up). Where each is an Int4Linear whose Forward of m rows runs the fused kernels on
/// rows in input order (no act-order gather), all of one K and g and prepared the same way (fp32,
/// rounded to bf16, int8, or the bf16 kernels' rows), the rows are prepared once and the weights
/// share one parallel pass (GemmW4*PackedMany: each output has the bits of its own Forward);
/// otherwise each Forward runs in turn.
void ForwardSameInput(const Linear* const* ls, float* const* ys, int64_t count, const float* x, int64_t m,
                      Workspace& ws);

}  // namespace nibble
