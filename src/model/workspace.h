// Scratch memory of one caller of the forward pass: a Session (it lives in the session's KvCache),
// an evaluation, a calibration run. A loaded model is read-only and shared by any number of
// threads; every buffer a forward writes besides its outputs is the caller's, here, so memory
// follows the sessions and their batch sizes, not the OS threads that ever ran a forward.
//
// One buffer per Slot, grown on demand and reused across calls (calibration runs a layer
// thousands of times; fresh multi-MB buffers would be mapped, faulted and zeroed each time).
// Contents are undefined between uses. A Workspace is used by one call at a time; copies start
// empty (scratch is not state: a copied cache gets its own).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "base/page_buffer.h"

namespace nibble {

/// A linear's dequantized or widened weight (Slot::kLinearTile) is held a tile of whole output
/// rows at a time and multiplied per tile, so the scratch is bounded whatever N: a 128256 x 4096
/// lm_head whole would need 2.1 GB in fp32, a tile 64 MiB. A tile has kLinearTileMinRows rows at
/// least (the GEMM repacks the input rows once per call, and every tile shape is one more oneDNN
/// primitive: small tiles cost prefill speed, docs/PERFORMANCE.md "Weight tiles"), more while it
/// fits the workspace's tile_bytes().
inline constexpr int64_t kLinearTileMinRows = 1024;
inline constexpr int64_t kLinearTileBytes = int64_t{64} << 20;

class Workspace {
 public:
  /// Who uses a buffer. Buffers of one call that are live at the same time have distinct slots.
  enum class Slot : int {
    kLayerNorm,      // decoder layer: RMSNormed rows [rows, hidden]
    kLayerResidual,  // decoder layer: h = x + attention [rows, hidden]
    kLayerOut,       // decoder layer: o_proj / down_proj output [rows, hidden]
    kQ,              // attention: q [rows, heads * head_dim]
    kK,              // attention: k [rows, kv_heads * head_dim]
    kV,              // attention: v [rows, kv_heads * head_dim]
    kAttn,           // attention output, o_proj input [rows, heads * head_dim]
    kGate,           // MLP: gate_proj output [rows, intermediate]
    kUp,             // MLP: up_proj output [rows, intermediate]
    kLinearGather,   // Int4Linear: act-order input rows in group order [m, K] fp32
    kLinearRows,     // linears: input rows aligned / rounded to bf16 / as bf16 bits / prepared [m, K]
    kLinearRowsWide, // SgemmWidenedBf16: a block of input rows rounded to bf16 [kWidenedRows, K] fp32
    kLinearTile,     // linears: a dequantized / widened weight tile (LinearTileRows rows)
    kLinearTileBf16, // Int4Linear without a bf16 matmul: a weight tile dequantized to bf16
    kLinearOut,      // linears: one tile's output rows when the GEMM cannot write with a stride
    kLinearAligned,  // linears: input rows copied to 64-byte alignment for the fused kernels
    kCount
  };

  Workspace() = default;
  Workspace(const Workspace& o) : tile_bytes_(o.tile_bytes_) {}
  Workspace& operator=(const Workspace& o) {
    tile_bytes_ = o.tile_bytes_;
    return *this;
  }
  Workspace(Workspace&&) noexcept = default;
  Workspace& operator=(Workspace&&) noexcept = default;

  /// At least `bytes` bytes for `slot`, 64-byte aligned (2 MiB and huge pages from 2 MiB on).
  /// Keeps the buffer when it is large enough; else replaces it (contents are not kept).
  uint8_t* Bytes(Slot slot, size_t bytes);
  template <class T>
  T* Get(Slot slot, int64_t count) {
    return reinterpret_cast<T*>(Bytes(slot, static_cast<size_t>(count) * sizeof(T)));
  }
  /// Bytes held by every buffer.
  int64_t bytes() const;
  /// Frees every buffer when more than `keep` bytes are held (a long prompt's scratch is not
  /// kept for the decode steps after it, which need a few hundred KB).
  void Trim(size_t keep);
  /// The budget of a linear's weight tile (LinearTileRows); tests set small ones.
  int64_t tile_bytes() const { return tile_bytes_; }
  void set_tile_bytes(int64_t bytes) { tile_bytes_ = bytes; }

 private:
  std::array<PageBuffer, static_cast<size_t>(Slot::kCount)> buffers_;
  int64_t tile_bytes_ = kLinearTileBytes;
};

/// Rows of an [n, k] weight per tile of `elem_bytes`-byte values: tile_bytes / row bytes rounded
/// down to a multiple of 64, at least kLinearTileMinRows, at most n. The tile's bytes are
/// max(tile_bytes, kLinearTileMinRows · k · elem_bytes) at most.
int64_t LinearTileRows(int64_t n, int64_t k, int64_t elem_bytes, int64_t tile_bytes = kLinearTileBytes);

/// `x` when it is 64-byte aligned, else a copy of its `count` floats in ws (Slot::kLinearAligned):
/// the fused kernels then never copy into a scratch of their own (kernels/aligned_acts.h).
const float* AlignedRows(const float* x, int64_t count, Workspace& ws);

}  // namespace nibble
