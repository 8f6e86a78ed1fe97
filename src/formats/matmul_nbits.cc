#include "formats/matmul_nbits.h"

namespace nibble {

namespace {

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

Result<int64_t> MatMulNBitsBlockSize(const Int4Matrix& m, const std::string& module) {
  if (m.group_size == m.k && !(IsPowerOfTwo(m.k) && m.k >= 16)) {
    if (m.k >= 128) return int64_t{128};
    int64_t b = 16;
    while (b < m.k) b *= 2;
    return b;
  }
  if (IsPowerOfTwo(m.group_size) && m.group_size >= 16) return m.group_size;
  return MakeErrorCode(ErrorCode::kUnsupported, "linear ", module, " has group_size ", m.group_size,
                       ": MatMulNBits takes block sizes that are powers of two >= 16 (16, 32, 64, 128, 256, ...); "
                       "re-quantize the model with such a --group_size (e.g. 32 or 128)");
}

Result<MatMulNBitsWeight> ToMatMulNBits(const Int4Matrix& m, const std::string& module) {
  if (!HasNaturalGroups(m))
    return MakeErrorCode(ErrorCode::kUnsupported, "linear ", module,
                         " has an act-order g_idx (columns not in group order): MatMulNBits has no column order; "
                         "re-quantize without --actorder group, or with --actorder static");
  MatMulNBitsWeight w;
  NIBBLE_ASSIGN_OR_RETURN(w.block_size, MatMulNBitsBlockSize(m, module));
  w.n = m.n;
  w.k = m.k;
  w.k_blocks = (m.k + w.block_size - 1) / w.block_size;
  const int64_t blob = w.block_size / 2, padded_k = w.k_blocks * w.block_size, zp_row = (w.k_blocks + 1) / 2;
  const int64_t groups = m.groups();
  w.b.assign(static_cast<size_t>(m.n * w.k_blocks * blob), 0);
  w.scales.resize(static_cast<size_t>(m.n * w.k_blocks));
  if (!m.symmetric) w.zero_points.assign(static_cast<size_t>(m.n * zp_row), 0);
  for (int64_t r = 0; r < m.n; ++r) {
    const uint8_t* codes = m.codes.data() + r * m.k;
    uint8_t* b = w.b.data() + r * padded_k / 2;
    for (int64_t c = 0; c < m.k; ++c) b[c / 2] |= static_cast<uint8_t>(codes[c] << (4 * (c & 1)));
    for (int64_t kb = 0; kb < w.k_blocks; ++kb) {
      // A block never straddles groups: block_size divides group_size, or the row is one group.
      const int64_t g = r * groups + (kb * w.block_size) / m.group_size;
      w.scales[static_cast<size_t>(r * w.k_blocks + kb)] = m.scales[static_cast<size_t>(g)];
      if (!m.symmetric)
        w.zero_points[static_cast<size_t>(r * zp_row + kb / 2)] |=
            static_cast<uint8_t>(m.zero_points[static_cast<size_t>(g)] << (4 * (kb & 1)));
    }
  }
  return w;
}

}  // namespace nibble
