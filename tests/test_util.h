// Helpers shared by several test suites.
#pragma once

#include <cstdint>
#include <random>

#include "formats/int4_matrix.h"

namespace nibble_test {

/// A random native int4 matrix [n, k] with group size g: codes uniform in 0..15, zero points
/// uniform in 0..15 (8 when `sym`), scales uniform in [scale_lo, scale_hi). Draws codes, then zero
/// points, then scales from `rng`, in row-major order.
inline nibble::Int4Matrix RandomInt4Matrix(std::mt19937& rng, int64_t n, int64_t k, int64_t g, bool sym,
                                           float scale_lo = 1e-3f, float scale_hi = 0.05f) {
  nibble::Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = sym;
  std::uniform_int_distribution<int> nib(0, 15);
  std::uniform_real_distribution<float> sc(scale_lo, scale_hi);
  m.codes.resize(static_cast<size_t>(n * k));
  for (auto& c : m.codes) c = static_cast<uint8_t>(nib(rng));
  m.zero_points.resize(static_cast<size_t>(n * (k / g)));
  m.scales.resize(m.zero_points.size());
  for (auto& z : m.zero_points) z = sym ? 8 : static_cast<uint8_t>(nib(rng));
  for (auto& s : m.scales) s = sc(rng);
  return m;
}

}  // namespace nibble_test
