// ONNX Runtime's com.microsoft.MatMulNBits weight layout (SPEC §5), from the native Int4Matrix.
//
//   B           uint8 [N, k_blocks, block_size / 2]: in each block, column 2i in the low nibble
//               and 2i + 1 in the high nibble of byte i; K padded to k_blocks·block_size with 0.
//   scales      [N · k_blocks] row-major (n, block), in the graph's float dtype.
//   zero_points uint8 [N · ceil(k_blocks / 2)]: block kb of row n in byte n·ceil(k_blocks/2) + kb/2,
//               low nibble when kb is even; absent for symmetric int4 (ORT's default zero is 8,
//               which is nibble's symmetric zero point, so the codes carry over unchanged).
// Codes are carried over, never dequantized and re-derived.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/int4_matrix.h"

namespace nibble {

struct MatMulNBitsWeight {
  int64_t n = 0, k = 0, block_size = 0, k_blocks = 0;
  std::vector<uint8_t> b;            // [N, k_blocks, block_size / 2]
  std::vector<float> scales;         // [N * k_blocks]
  std::vector<uint8_t> zero_points;  // [N * ceil(k_blocks / 2)]; empty when symmetric
};

/// The block size a layer is written with: its group size when that is a power of two >= 16;
/// for one group per row (group_size == K), 128, or the power of two >= max(K, 16) when K < 128
/// (the row's scale is repeated per block, K padded). Errors (kUnsupported) name `module`, the
/// group size and the re-quantize hint for any other group size.
Result<int64_t> MatMulNBitsBlockSize(const Int4Matrix& m, const std::string& module);

/// Repacks `m` (which must have natural groups: an act-order g_idx is an error naming `module`).
Result<MatMulNBitsWeight> ToMatMulNBits(const Int4Matrix& m, const std::string& module);

}  // namespace nibble
