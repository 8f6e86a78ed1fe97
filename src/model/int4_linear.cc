#include "model/int4_linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/page_buffer.h"
#include "base/parallel.h"
#include "kernels/bf16_gemv.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_dispatch.h"
#include "kernels/int4_gemm.h"

namespace nibble {

namespace {

using Slot = Workspace::Slot;

// The opt-in paths' shape: every row of x [m, k] prepared once (`prepare(row, row_scratch)` ->
// Acts; rows in parallel for large batches) into the caller's workspace (`row_bytes` per row,
// 64-byte aligned, so activation loads never split cache lines), then one pass over W for all
// rows (`gemm(acts, m)`).
template <class Acts, class Prepare, class Gemm>
void ForwardPrepared(const float* x, int64_t m, int64_t k, size_t row_bytes, Workspace& ws, Prepare prepare,
                     Gemm gemm) {
  std::vector<Acts> acts(static_cast<size_t>(m));
  // Plain pointers for the OpenMP region.
  uint8_t* const sp = ws.Bytes(Slot::kLinearRows, row_bytes * static_cast<size_t>(m));
  Acts* const ap = acts.data();
  ParallelFor(m, m * k >= kTeamMinWork,
              [&](int64_t i) { ap[i] = prepare(x + i * k, sp + row_bytes * static_cast<size_t>(i)); });
  gemm(ap, m);
}

// Rows [n0, n0 + rows) of a packed weight, as a weight of its own (rows are contiguous records).
W4PackedWeight RowsOf(const W4PackedWeight& w, int64_t n0, int64_t rows) {
  W4PackedWeight t = w;
  t.n = rows;
  t.data = w.data + n0 * w.row_bytes;
  return t;
}

// The fused kernels for the weights of `jobs` (one K and g, all on `route`) on x[m, K]: each row
// prepared once the route's way, then all the weights' GEMMs in one pass (GemmW4*PackedMany).
void ForwardFusedJobs(Int4Linear::Route route, const W4Job* jobs, int64_t count, const float* x, int64_t m,
                      Workspace& ws) {
  const W4PackedWeight& w0 = *jobs[0].w;
  const int64_t k = w0.k;
  using Route = Int4Linear::Route;
  switch (route) {
    case Route::kFusedInt8: {
      const int64_t parts = W4Int8Parts(w0.group_size);
      return ForwardPrepared<W4Int8Acts>(
          x, m, k, W4Int8ActsBytes(k, parts), ws,
          [&](const float* row, uint8_t* s) { return QuantizeActsInt8(row, k, parts, s); },
          [&](const W4Int8Acts* a, int64_t rows) { GemmW4A8PackedMany(jobs, count, a, rows); });
    }
    case Route::kFusedBf16:
      return ForwardPrepared<W4Bf16Acts>(
          x, m, k, W4Bf16ActsBytes(k, w0.group_size), ws,
          [&](const float* row, uint8_t* s) { return PrepareActsBf16(row, k, w0.group_size, s); },
          [&](const W4Bf16Acts* a, int64_t rows) { GemmW4Bf16PackedMany(jobs, count, a, rows); });
    case Route::kFusedRoundedBf16: {
      // The bf16 inputs through the W4A32 kernels: no bf16 kernel on this CPU.
      float* const xr = ws.Get<float>(Slot::kLinearRows, m * k);
      RoundToBf16(x, m * k, xr);
      return GemmW4A32PackedMany(jobs, count, xr, m);
    }
    default:
      return GemmW4A32PackedMany(jobs, count, AlignedRows(x, m * k, ws), m);
  }
}

// Columns [0, nt) of src [m, nt] into columns [n0, n0 + nt) of y [m, n] (y + n0 given).
void CopyTileColumns(const float* src, int64_t m, int64_t nt, float* y, int64_t n) {
  for (int64_t i = 0; i < m; ++i) std::memcpy(y + i * n, src + i * nt, static_cast<size_t>(nt) * sizeof(float));
}

}  // namespace

Int4Linear::Int4Linear(const Int4Matrix& weight, std::vector<float> bias, std::string desc,
                       const PackedAllocator& alloc)
    : bias_(std::move(bias)), desc_(std::move(desc)) {
  NIBBLE_CHECK(weight.g_idx.empty() || ValidateInt4Matrix(weight, "Int4Linear").ok());
  Int4Matrix sorted;
  if (!HasNaturalGroups(weight)) sorted = SortColumnsByGroup(weight, &perm_);
  const Int4Matrix& w = perm_.empty() ? weight : sorted;
  NIBBLE_CHECK(w.n >= 1 && w.k >= 1 && w.group_size >= 1 && w.k % w.group_size == 0);
  NIBBLE_CHECK(static_cast<int64_t>(w.codes.size()) == w.n * w.k);
  NIBBLE_CHECK(static_cast<int64_t>(w.scales.size()) == w.n * w.groups());
  NIBBLE_CHECK(w.zero_points.size() == w.scales.size());
  const size_t bytes = static_cast<size_t>(W4PackedBytes(w.n, w.k, w.group_size, w.symmetric));
  if (alloc) {
    packed_ = alloc(bytes);
    NIBBLE_CHECK(packed_.size() == bytes);
    std::memset(packed_.data(), 0, bytes);  // a partial last record's padding stays zero
  } else {
    packed_ = PageBuffer(bytes);
  }
  pw_ = PackW4(w.n, w.k, w.group_size, w.symmetric, w.codes.data(), w.scales.data(), w.zero_points.data(),
               packed_.data());
}

Int4Linear::Int4Linear(const uint8_t* packed, size_t bytes, const W4PackedWeight& geometry, std::vector<float> bias,
                       std::string desc)
    : packed_(bytes), pw_(geometry), bias_(std::move(bias)), desc_(std::move(desc)) {
  if (bytes > 0) std::memcpy(packed_.data(), packed, bytes);
  NIBBLE_CHECK(static_cast<int64_t>(packed_.size()) ==
               W4PackedBytes(pw_.n, pw_.k, pw_.group_size, pw_.symmetric));
  W4PackedWeight expect = W4PackedGeometry(pw_.n, pw_.k, pw_.group_size, pw_.symmetric);
  NIBBLE_CHECK(pw_.row_bytes == expect.row_bytes && pw_.rec_bytes == expect.rec_bytes);
  pw_ = expect;
  pw_.data = packed_.data();
}

Int4Linear::Int4Linear(PageBuffer packed, const W4PackedWeight& geometry, std::vector<float> bias, std::string desc)
    : packed_(std::move(packed)), pw_(geometry), bias_(std::move(bias)), desc_(std::move(desc)) {
  pw_.data = packed_.data();
}

namespace {

// Four 32-bit lanes (SSE2 in the generic build): four stored columns at once.
using U32x4 = uint32_t __attribute__((vector_size(16)));

// Transposes an 8 x 8 matrix of nibbles held in eight words (row r = a[r], column i = nibble i)
// in place: afterwards nibble j of a[i] is what nibble i of a[j] was. Three rounds of swapping
// blocks (1, 2 and 4 nibbles) between word pairs. W: uint32_t, or U32x4 for four matrices.
template <class W>
inline void TransposeNibbles8x8(W (&a)[8]) {
  for (int r = 0; r < 8; r += 2) {
    const W t = ((a[r] >> 4) ^ a[r + 1]) & 0x0F0F0F0Fu;
    a[r + 1] ^= t;
    a[r] ^= t << 4;
  }
  for (int r : {0, 1, 4, 5}) {
    const W t = ((a[r] >> 8) ^ a[r + 2]) & 0x00FF00FFu;
    a[r + 2] ^= t;
    a[r] ^= t << 8;
  }
  for (int r = 0; r < 4; ++r) {
    const W t = ((a[r] >> 16) ^ a[r + 4]) & 0x0000FFFFu;
    a[r + 4] ^= t;
    a[r] ^= t << 16;
  }
}

// The codes of outputs [8·c0, 8·c1) into w's superblocks. W4P dword l of superblock b holds
// inputs 128b + 16j + l (j = 0..7) as nibbles j; stored word (kk, c) holds outputs 8c + order[i]
// of input kk as nibbles i: the eight words kk = 128b + 16j + l (j = 0..7) of column c,
// transposed, are dword l of superblock b for each of the eight outputs. Four adjacent columns
// (16 contiguous bytes of each input row) go through one vector transpose.
void RepackTransposedColumns(const TransposedNibbleCodes& src, const W4PackedWeight& w, int64_t c0, int64_t c1,
                             uint8_t* out) {
  const int64_t words = w.n / 8, sb_per_rec = w.rec_weights / 128;
  const uint32_t flip = 0x11111111u * src.xor_mask;
  for (int64_t b = 0; b < w.k / 128; ++b) {
    const int64_t rec = b / sb_per_rec;
    const int64_t sb_offset = rec * w.rec_bytes + w.rec_header + (b % sb_per_rec) * 64;
    const uint8_t* const in = src.words + 128 * b * words * 4;
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4)
      for (int l = 0; l < 16; ++l) {
        U32x4 a[8];
        for (int j = 0; j < 8; ++j) std::memcpy(&a[j], in + ((16 * j + l) * words + c) * 4, 16);
        TransposeNibbles8x8(a);
        for (int i = 0; i < 8; ++i) {
          const U32x4 d = a[i] ^ flip;
          for (int q = 0; q < 4; ++q) {
            const uint32_t v = d[q];
            std::memcpy(out + (8 * (c + q) + src.order[i]) * w.row_bytes + sb_offset + 4 * l, &v, 4);
          }
        }
      }
    for (; c < c1; ++c)
      for (int l = 0; l < 16; ++l) {
        uint32_t a[8];
        for (int j = 0; j < 8; ++j) std::memcpy(&a[j], in + ((16 * j + l) * words + c) * 4, 4);
        TransposeNibbles8x8(a);
        for (int i = 0; i < 8; ++i) {
          const uint32_t d = a[i] ^ flip;
          std::memcpy(out + (8 * c + src.order[i]) * w.row_bytes + sb_offset + 4 * l, &d, 4);
        }
      }
  }
}

// Rows [r0, r1) of w's record headers: each record's fp32 scales, then (asymmetric) its zero
// points, from m (K % R == 0: every record full).
void WriteRecordHeaders(const Int4Matrix& m, const W4PackedWeight& w, int64_t r0, int64_t r1, uint8_t* out) {
  const int64_t groups = m.groups();
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      uint8_t* rec = out + r * w.row_bytes + ri * w.rec_bytes;
      const size_t at = static_cast<size_t>(r * groups + ri * w.rec_groups);
      std::memcpy(rec, &m.scales[at], static_cast<size_t>(4 * w.rec_groups));
      if (m.symmetric) continue;
      for (int64_t gi = 0; gi < w.rec_groups; ++gi) {
        NIBBLE_CHECK(m.zero_points[at + static_cast<size_t>(gi)] <= 15);
        rec[4 * w.rec_groups + gi] = m.zero_points[at + static_cast<size_t>(gi)];
      }
    }
}

}  // namespace

std::unique_ptr<Int4Linear> Int4Linear::FromTransposed(const DeferredInt4& d, std::vector<float> bias,
                                                       std::string desc, const PackedAllocator& alloc) {
  const Int4Matrix& m = d.matrix;
  if (m.n % 8 != 0 || m.k % 128 != 0 || m.group_size % 16 != 0 || !m.g_idx.empty()) return nullptr;
  NIBBLE_CHECK(m.n >= 1 && m.k >= 1 && m.k % m.group_size == 0 && d.codes.words != nullptr);
  NIBBLE_CHECK(static_cast<int64_t>(m.scales.size()) == m.n * m.groups() && m.zero_points.size() == m.scales.size());
  W4PackedWeight w = W4PackedGeometry(m.n, m.k, m.group_size, m.symmetric);
  // Every byte is written below (K % R == 0: no padding), each row block by one thread.
  const size_t bytes = static_cast<size_t>(W4PackedBytes(m.n, m.k, m.group_size, m.symmetric));
  PageBuffer packed = alloc ? alloc(bytes) : PageBuffer(bytes, PageBuffer::Uninitialized{});
  NIBBLE_CHECK(packed.size() == bytes);
  uint8_t* const out = packed.data();
  // Blocks of 16 stored columns (128 outputs): each input row's 16 words are one cache line.
  const int64_t columns = m.n / 8, blocks = (columns + 15) / 16;
  ParallelFor(blocks, m.n * m.k >= kTeamMinWork, [&](int64_t blk) {
    const int64_t c0 = 16 * blk, c1 = std::min(columns, c0 + 16);
    WriteRecordHeaders(m, w, 8 * c0, 8 * c1, out);
    RepackTransposedColumns(d.codes, w, c0, c1, out);
  });
  return std::unique_ptr<Int4Linear>(new Int4Linear(std::move(packed), w, std::move(bias), std::move(desc)));
}

void Int4Linear::MovePacked(PageBuffer same_bytes) {
  NIBBLE_CHECK(same_bytes.size() == packed_.size());
  packed_ = std::move(same_bytes);
  pw_.data = packed_.data();
}

std::unique_ptr<Int4Linear> Int4Linear::FromPacked(PageBuffer packed, int64_t n, int64_t k, int64_t group_size,
                                                   bool symmetric, std::vector<int32_t> column_order,
                                                   std::vector<float> bias, std::string desc) {
  NIBBLE_CHECK(static_cast<int64_t>(packed.size()) == W4PackedBytes(n, k, group_size, symmetric));
  NIBBLE_CHECK(column_order.empty() || static_cast<int64_t>(column_order.size()) == k);
  auto l = std::unique_ptr<Int4Linear>(new Int4Linear(std::move(packed), W4PackedGeometry(n, k, group_size, symmetric),
                                                      std::move(bias), std::move(desc)));
  l->perm_ = std::move(column_order);
  return l;
}

Int4Matrix Int4Linear::weight() const {
  Int4Matrix m;
  m.n = pw_.n;
  m.k = pw_.k;
  m.group_size = pw_.group_size;
  m.symmetric = pw_.symmetric;
  m.codes.resize(static_cast<size_t>(m.n * m.k));
  m.scales.resize(static_cast<size_t>(m.n * m.groups()));
  m.zero_points.resize(m.scales.size());
  UnpackW4(pw_, m.codes.data(), m.scales.data(), m.zero_points.data());
  if (perm_.empty()) return m;
  Int4Matrix original = m;
  original.g_idx.resize(static_cast<size_t>(m.k));
  for (int64_t j = 0; j < m.k; ++j) {
    const int32_t c = perm_[static_cast<size_t>(j)];
    original.g_idx[static_cast<size_t>(c)] = static_cast<int32_t>(j / m.group_size);
    for (int64_t r = 0; r < m.n; ++r) original.codes[r * m.k + c] = m.codes[r * m.k + j];
  }
  return original;
}

bool Int4Linear::SetInt8Activations(bool on) {
  int8_ = on && W4Int8Supported(pw_);
  if (int8_) bf16_ = false;
  return int8_;
}

int64_t Int4Linear::Bf16MatmulMinRows(int64_t group_size) {
  if (ActiveW4Dispatch().kernels.gemm_bf16_amx != nullptr && group_size % 128 == 0) return kBf16MatmulMinRowsAmxTiles;
  static const int64_t rows = DenseGemmHasAmx() ? kBf16MatmulMinRowsAmx : kBf16MatmulMinRowsNoAmx;
  return rows;
}

bool Int4Linear::Bf16KernelServes(int64_t m) const {
  return ActiveW4Dispatch().kernels.gemm_bf16 != nullptr && m < Bf16MatmulMinRows(pw_.group_size);
}

bool Int4Linear::SetBf16Activations(bool on) {
  bf16_ = on && W4Bf16Supported(pw_);
  if (bf16_) int8_ = false;
  return bf16_;
}

void Int4Linear::Forward(const float* x, int64_t m, float* y, Workspace* ws) const {
  Workspace local;
  Workspace& w = ws != nullptr ? *ws : local;
  if (perm_.empty()) return ForwardInOrder(x, m, y, w);
  const int64_t k = pw_.k;
  float* const xp = w.Get<float>(Slot::kLinearGather, m * k);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < k; ++j) xp[r * k + j] = x[r * k + perm_[static_cast<size_t>(j)]];
  }
  ForwardInOrder(xp, m, y, w);
}

Int4Linear::Route Int4Linear::RouteFor(int64_t m) const {
  const bool fused = m < kDequantGemmMinRows;
  if (int8_) return Route::kFusedInt8;
  if (!bf16_) return fused ? Route::kFusedFp32 : Route::kDenseFp32;
  const bool prefill = m >= Bf16MatmulMinRows(pw_.group_size);
  if (prefill && !ActiveW4Dispatch().kernels.bf16_prefill_sgemm) return Route::kBf16Matmul;
  // The same bf16 inputs through the W4A32 path: no bf16 kernel on this CPU, or a prefill where
  // the fp32 sgemm outruns the bf16 matmul.
  if (prefill || !Bf16KernelServes(m)) return fused ? Route::kFusedRoundedBf16 : Route::kDenseRoundedBf16;
  return Route::kFusedBf16;
}

void Int4Linear::ForwardInOrder(const float* x, int64_t m, float* y, Workspace& ws) const {
  const Route route = RouteFor(m);
  switch (route) {
    case Route::kBf16Matmul: return ForwardBf16Matmul(x, m, y, ws);
    case Route::kDenseFp32: return ForwardDenseW4A32(x, m, y, ws);
    case Route::kDenseRoundedBf16: {
      float* const xr = ws.Get<float>(Slot::kLinearRows, m * pw_.k);
      RoundToBf16(x, m * pw_.k, xr);
      return ForwardDenseW4A32(xr, m, y, ws);
    }
    default: {
      const W4Job job{&pw_, bias_.empty() ? nullptr : bias_.data(), y};
      return ForwardFusedJobs(route, &job, 1, x, m, ws);
    }
  }
}

void ForwardSameInput(const Linear* const* ls, float* const* ys, int64_t count, const float* x, int64_t m,
                      Workspace& ws) {
  using Route = Int4Linear::Route;
  std::vector<W4Job> jobs;
  Route route = Route::kDenseFp32;
  for (int64_t i = 0; i < count; ++i) {
    const auto* l = dynamic_cast<const Int4Linear*>(ls[i]);
    if (l == nullptr || !l->perm_.empty()) break;
    const Route r = l->RouteFor(m);
    const bool fused = r == Route::kFusedFp32 || r == Route::kFusedRoundedBf16 || r == Route::kFusedInt8 ||
                       r == Route::kFusedBf16;
    if (!fused || (!jobs.empty() && (r != route || l->pw_.k != jobs[0].w->k ||
                                     l->pw_.group_size != jobs[0].w->group_size)))
      break;
    route = r;
    jobs.push_back({&l->pw_, l->bias_.empty() ? nullptr : l->bias_.data(), ys[i]});
  }
  if (static_cast<int64_t>(jobs.size()) < count || count < 2) {
    for (int64_t i = 0; i < count; ++i) ls[i]->Forward(x, m, ys[i], &ws);
    return;
  }
  ForwardFusedJobs(route, jobs.data(), count, x, m, ws);
}

// The weight in tiles of LinearTileRows rows, each dequantized to bf16 in the workspace and
// multiplied at once (bounded scratch whatever the matrix; the tile is still in cache when the
// matmul reads it).
void Int4Linear::ForwardBf16Matmul(const float* x, int64_t m, float* y, Workspace& ws) const {
  const int64_t n = pw_.n, k = pw_.k;
  const int64_t tile = LinearTileRows(n, k, 2, ws.tile_bytes());
  if (!GemmBf16Usable(tile, k) || (n % tile != 0 && !GemmBf16Usable(n % tile, k))) {
    // No bf16 matmul on this CPU: the same bf16 values widened exactly, through the fp32 GEMM.
    SgemmWidenedBf16(x, m, n, k, true, [&](int64_t n0, int64_t nt) {
      uint16_t* const wb = ws.Get<uint16_t>(Slot::kLinearTileBf16, nt * k);
      DequantW4PackedBf16(RowsOf(pw_, n0, nt), wb);
      return static_cast<const uint16_t*>(wb);
    }, y, ws);
  } else {
    uint16_t* const xb = ws.Get<uint16_t>(Slot::kLinearRows, m * k);
    ToBf16Bits(x, m * k, xb);
    uint16_t* const wb = ws.Get<uint16_t>(Slot::kLinearTile, tile * k);
    // oneDNN's matmul writes a dense [m, nt] block: tiles narrower than y go through a buffer.
    float* const yt = tile < n ? ws.Get<float>(Slot::kLinearOut, m * tile) : y;
    for (int64_t n0 = 0; n0 < n; n0 += tile) {
      const int64_t nt = std::min(tile, n - n0);
      DequantW4PackedBf16(RowsOf(pw_, n0, nt), wb);
      NIBBLE_CHECK(GemmBf16XWt(m, nt, k, xb, wb, yt));
      if (yt != y) CopyTileColumns(yt, m, nt, y + n0, n);
    }
  }
  if (!bias_.empty()) AddBiasRows(y, m, n, bias_.data());
}

// Large M: exact fp32 weights, a tile of rows at a time in the workspace, each through the dense
// GEMM (the dequantization is amortised over M rows; the scratch is one tile, LinearTileRows).
void Int4Linear::ForwardDenseW4A32(const float* x, int64_t m, float* y, Workspace& ws) const {
  const int64_t n = pw_.n, k = pw_.k;
  const int64_t tile = LinearTileRows(n, k, 4, ws.tile_bytes());
  float* const dense = ws.Get<float>(Slot::kLinearTile, tile * k);
  for (int64_t n0 = 0; n0 < n; n0 += tile) {
    const int64_t nt = std::min(tile, n - n0);
    DequantW4Packed(RowsOf(pw_, n0, nt), dense);
    SgemmXWtTiled(m, nt, k, x, k, dense, k, y + n0, n);
  }
  if (!bias_.empty()) AddBiasRows(y, m, n, bias_.data());
}

}  // namespace nibble
