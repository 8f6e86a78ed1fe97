// Int4Matrix validation and reference dequantization.
#include "formats/int4_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "base/check.h"

namespace nibble {

namespace {

Status ValidateGIdx(const Int4Matrix& m, const std::string& what) {
  if (static_cast<int64_t>(m.g_idx.size()) != m.k)
    return MakeError(what, ": g_idx has ", m.g_idx.size(), " entries, expected K = ", m.k);
  std::vector<int64_t> count(static_cast<size_t>(m.groups()), 0);
  for (int64_t c = 0; c < m.k; ++c) {
    const int32_t g = m.g_idx[static_cast<size_t>(c)];
    if (g < 0 || g >= m.groups())
      return MakeError(what, ": g_idx[", c, "] = ", g, " out of range 0..", m.groups() - 1);
    ++count[static_cast<size_t>(g)];
  }
  for (size_t g = 0; g < count.size(); ++g) {
    if (count[g] != m.group_size)
      return MakeError(what, ": g_idx puts ", count[g], " columns in group ", g, ", expected group_size = ", m.group_size);
  }
  return Status::Ok();
}

}  // namespace

Error InvalidScaleError(const std::string& where, float s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(s));  // -0.25, nan, inf: as stored
  return MakeErrorCode(ErrorCode::kCorruptInput, where, " is ", text, " (expected a finite scale >= 0)");
}

Status ValidateInt4Matrix(const Int4Matrix& m, const std::string& what) {
  if (m.n < 1 || m.k < 1)
    return MakeError(what, ": int4 matrix shape [", m.n, ", ", m.k, "] must have N >= 1 and K >= 1");
  if (m.group_size < 1 || m.group_size > m.k || m.k % m.group_size != 0)
    return MakeError(what, ": group size ", m.group_size, " does not divide K = ", m.k);
  if (m.n > INT64_MAX / m.k) return MakeError(what, ": N * K overflows (N = ", m.n, ", K = ", m.k, ")");
  const int64_t g_count = m.groups();
  const size_t nk = static_cast<size_t>(m.n * m.k);
  const size_t ng = static_cast<size_t>(m.n * g_count);
  if (m.codes.size() != nk) return MakeError(what, ": codes has ", m.codes.size(), " elements, expected N*K = ", nk);
  if (m.scales.size() != ng) return MakeError(what, ": scales has ", m.scales.size(), " elements, expected N*G = ", ng);
  if (m.zero_points.size() != ng)
    return MakeError(what, ": zero_points has ", m.zero_points.size(), " elements, expected N*G = ", ng);
  // Blocks OR-ed in one vectorisable pass; only a block with a code above 15 is scanned again.
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < nk; b += kBlock) {
    const size_t e = std::min(nk, b + kBlock);
    uint8_t any = 0;
    for (size_t i = b; i < e; ++i) any |= m.codes[i];
    if ((any & 0xF0) == 0) continue;
    for (size_t i = b; i < e; ++i) {
      if (m.codes[i] > 15)
        return MakeError(what, ": codes[", i / m.k, "][", i % m.k, "] = ", int{m.codes[i]}, " out of range 0..15");
    }
  }
  if (!m.g_idx.empty()) NIBBLE_RETURN_IF_ERROR(ValidateGIdx(m, what));
  for (size_t i = 0; i < ng; ++i) {
    const int64_t row = static_cast<int64_t>(i) / g_count, grp = static_cast<int64_t>(i) % g_count;
    if (m.zero_points[i] > 15)
      return MakeError(what, ": zero_points[", row, "][", grp, "] = ", int{m.zero_points[i]}, " out of range 0..15");
    if (m.symmetric && m.zero_points[i] != 8)
      return MakeError(what, ": zero_points[", row, "][", grp, "] = ", int{m.zero_points[i]},
                       ", expected 8 for a symmetric matrix");
    if (!IsValidScale(m.scales[i]))
      return InvalidScaleError(what + ": scales[" + std::to_string(row) + "][" + std::to_string(grp) + "]", m.scales[i]);
  }
  return Status::Ok();
}

void DequantizeRef(const Int4Matrix& m, float* out) {
  NIBBLE_CHECK(m.n >= 0 && m.k >= 0 && m.group_size > 0 && m.k % m.group_size == 0);
  const int64_t G = m.groups();
  NIBBLE_CHECK(m.g_idx.empty() || m.g_idx.size() == static_cast<size_t>(m.k));
  NIBBLE_CHECK(m.codes.size() == static_cast<size_t>(m.n * m.k));
  NIBBLE_CHECK(m.scales.size() == static_cast<size_t>(m.n * G) && m.zero_points.size() == m.scales.size());
  for (int64_t r = 0; r < m.n; ++r) {
    for (int64_t c = 0; c < m.k; ++c) {
      const int64_t gi = r * G + m.GroupOf(c);
      const int diff = int{m.codes[r * m.k + c]} - int{m.zero_points[gi]};
      out[r * m.k + c] = static_cast<float>(diff) * m.scales[gi];
    }
  }
}

bool HasNaturalGroups(const Int4Matrix& m) {
  for (size_t c = 0; c < m.g_idx.size(); ++c) {
    if (m.g_idx[c] != static_cast<int64_t>(c) / m.group_size) return false;
  }
  return true;
}

Int4Matrix SortColumnsByGroup(const Int4Matrix& m, std::vector<int32_t>* perm) {
  perm->clear();
  Int4Matrix out = m;
  out.g_idx.clear();
  if (HasNaturalGroups(m)) return out;
  perm->resize(static_cast<size_t>(m.k));
  std::iota(perm->begin(), perm->end(), 0);
  std::stable_sort(perm->begin(), perm->end(), [&](int32_t a, int32_t b) { return m.g_idx[a] < m.g_idx[b]; });
  for (int64_t r = 0; r < m.n; ++r) {
    for (int64_t j = 0; j < m.k; ++j) out.codes[r * m.k + j] = m.codes[r * m.k + (*perm)[j]];
  }
  return out;
}

}  // namespace nibble
