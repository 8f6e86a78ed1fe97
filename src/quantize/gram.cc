// XᵀX in fixed blocks (see gram.h).
#include "quantize/gram.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "base/check.h"
#include "kernels/dense_gemm.h"

namespace nibble {

namespace {

constexpr int64_t kCols = 64, kChunk = 2048;

// Whether every x[i] is a bf16 value (the low 16 bits of its fp32 word are zero): a fixed OR
// reduction, the same answer for any thread count.
bool AllBf16Valued(const float* x, int64_t n) {
  uint32_t low = 0;
#pragma omp parallel for schedule(static) reduction(| : low)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof(b));
    low |= b & 0xFFFFu;
  }
  return low == 0;
}

// Whether the bf16 matmul runs every (N = block width `cols`, K = chunk rows) shape of x [rows, k]
// in blocks of `cols` columns and chunks of `chunk` rows.
bool Bf16GemmCovers(int64_t rows, int64_t k, int64_t cols, int64_t chunk) {
  for (int64_t w : {std::min(cols, k), k % cols})
    for (int64_t nr : {std::min(chunk, rows), rows % chunk})
      if (w > 0 && nr > 0 && !GemmBf16Usable(w, nr)) return false;
  return true;
}

// x's bf16 bits transposed chunk by chunk: chunk c (rows [c·chunk, +nr)) is [k, nr] at
// offset c·chunk·k, so a column range of one chunk is a dense row-major [cols, nr] block.
std::vector<uint16_t> TransposedBf16Chunks(const float* x, int64_t rows, int64_t k, int64_t chunk = kChunk) {
  std::vector<uint16_t> t(static_cast<size_t>(rows * k));
  constexpr int64_t kTile = 64;
  const int64_t col_tiles = (k + kTile - 1) / kTile;
  const int64_t chunks = (rows + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t ct = 0; ct < col_tiles; ++ct) {
      const int64_t r0 = ch * chunk, nr = std::min(chunk, rows - r0);
      const int64_t c0 = ct * kTile, c1 = std::min(k, c0 + kTile);
      uint16_t* dst = t.data() + r0 * k;
      for (int64_t rb = 0; rb < nr; rb += kTile)
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = rb; r < std::min(nr, rb + kTile); ++r) {
            uint32_t b;
            std::memcpy(&b, x + (r0 + r) * k + c, sizeof(b));
            dst[c * nr + r] = static_cast<uint16_t>(b >> 16);
          }
    }
  return t;
}

}  // namespace

std::vector<float> GramMatrix(const float* x, int64_t rows, int64_t k, GramFill fill) {
  const int64_t blocks = (k + kCols - 1) / kCols;
  // bf16-valued inputs (a bf16 calibration's captures): the bf16 matmul gives the same exact
  // products with fp32 sums per chunk, at twice the sgemm's rate, from a transposed bf16 copy of
  // at most 2k rows at a time (no larger than G): each such part of the rows is added into G in
  // fp32, in row order. fp32 inputs run as one part.
  const bool bf16 = AllBf16Valued(x, rows * k) && Bf16GemmCovers(rows, k, kCols, kChunk);
  const int64_t part_rows = bf16 ? std::max(kChunk, 2 * k / kChunk * kChunk) : rows;
  std::vector<float> g(static_cast<size_t>(k * k));
  for (int64_t p0 = 0; p0 < rows; p0 += part_rows) {
    const int64_t np = std::min(part_rows, rows - p0);
    const float* xp = x + p0 * k;
    const std::vector<uint16_t> xt = bf16 ? TransposedBf16Chunks(xp, np, k) : std::vector<uint16_t>{};
#pragma omp parallel
    {
      std::vector<float> part(static_cast<size_t>(k * kCols));
      std::vector<double> acc(part.size());
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t c0 = b * kCols, w = std::min(kCols, k - c0);
        const int64_t i0 = fill == GramFill::kFull ? 0 : c0, m = k - i0;  // rows i0.. of G's column block
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t r0 = 0; r0 < np; r0 += kChunk) {
          const int64_t nr = std::min(kChunk, np - r0);
          if (bf16) {
            const uint16_t* ct = xt.data() + r0 * k;
            NIBBLE_CHECK(GemmBf16XWt(m, w, nr, ct + i0 * nr, ct + c0 * nr, part.data()));
          } else {
            SgemmAtB(m, w, nr, xp + r0 * k + i0, k, xp + r0 * k + c0, k, 0.0f, part.data(), w);
          }
          for (int64_t i = 0; i < m * w; ++i) acc[i] += part[i];
        }
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < w; ++j) {
            float& v = g[(i0 + i) * k + c0 + j];
            v = p0 == 0 ? static_cast<float>(acc[i * w + j]) : v + static_cast<float>(acc[i * w + j]);
          }
      }
    }
  }
  if (fill == GramFill::kLowerMirrored) MirrorLower(g.data(), k);
  return g;
}

void AccumulateGramLower(const float* x, int64_t rows, int64_t k, float* g) {
  // Square tiles on and below the diagonal, each one GEMM. Wide inputs take larger tiles: the
  // sgemm packs its strided panels once per call (docs/PERFORMANCE.md, "GPTQ's factorisation,
  // Gram tiles and error report").
  const int64_t tile = k >= 8192 ? 1024 : 512, blocks = (k + tile - 1) / tile;
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (row block, column block), column <= row
  for (int64_t i = 0; i < blocks; ++i)
    for (int64_t j = 0; j <= i; ++j) tiles.emplace_back(i, j);
  // bf16-valued rows (a 16-bit calibration's captures) where the bf16 matmul is usable: the same
  // exact products with fp32 sums, from a transposed bf16 copy of the rows ([k, rows], half of
  // x's bytes); each tile's sum is added into g.
  const bool bf16 = AllBf16Valued(x, rows * k) && Bf16GemmCovers(rows, k, tile, rows);
  const std::vector<uint16_t> xt = bf16 ? TransposedBf16Chunks(x, rows, k, rows) : std::vector<uint16_t>{};
#pragma omp parallel
  {
    std::vector<float> part(bf16 ? static_cast<size_t>(tile * tile) : 0);
#pragma omp for schedule(dynamic, 1)
    for (size_t t = 0; t < tiles.size(); ++t) {
      const int64_t i0 = tiles[t].first * tile, j0 = tiles[t].second * tile;
      const int64_t mi = std::min(tile, k - i0), nj = std::min(tile, k - j0);
      if (!bf16) {
        SgemmAtB(mi, nj, rows, x + i0, k, x + j0, k, 1.0f, g + i0 * k + j0, k);
        continue;
      }
      NIBBLE_CHECK(GemmBf16XWt(mi, nj, rows, xt.data() + i0 * rows, xt.data() + j0 * rows, part.data()));
      for (int64_t i = 0; i < mi; ++i)
        for (int64_t j = 0; j < nj; ++j) g[(i0 + i) * k + j0 + j] += part[i * nj + j];
    }
  }
}

void MirrorLower(float* g, int64_t k) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = i + 1; j < k; ++j) g[i * k + j] = g[j * k + i];
}

}  // namespace nibble
