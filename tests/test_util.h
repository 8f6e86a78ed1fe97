// Helpers shared by several test suites.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include <nibble/quantize.h>

#include "formats/int4_matrix.h"
#include "test_paths.h"

// NIBBLE_TEST_ASAN: built with AddressSanitizer (gcc or clang), whose shadow memory makes RSS
// and address-space limits meaningless.
#if defined(__SANITIZE_ADDRESS__)
#define NIBBLE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NIBBLE_TEST_ASAN 1
#endif
#endif

namespace nibble_test {

/// A size line of /proc/self/status ("VmRSS", "VmHWM", ...) in bytes; -1 when absent.
inline int64_t ProcStatusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

/// Unit roundoff of fp32 (round to nearest): u = 2^-24.
inline constexpr double kFp32UnitRoundoff = 0x1p-24;

/// γ_n = n·u / (1 − n·u), u = 2^-24: the bound on the relative error of n chained fp32 roundings
/// (Higham), e.g. |fl(Σ_k x_k w_k) − Σ_k x_k w_k| <= γ_K · Σ_k |x_k w_k| in any summation order.
inline double Fp32Gamma(int64_t n) {
  const double nu = static_cast<double>(n) * kFp32UnitRoundoff;
  return nu / (1.0 - nu);
}

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

/// A fresh directory "<system temp dir>/<prefix>XXXXXX" (mkdtemp), removed with its contents at
/// scope exit. Aborts when it cannot be created (a test cannot run without it).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "nibble_test_") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  /// path() + "/" + name.
  std::string sub(const std::string& name) const { return path_ + "/" + name; }
  /// Writes `text` to sub(name) (binary) and returns that path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = sub(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::string path_;
};

/// The embedded model quantized with the default request (Quark uint4 g128 RTN) into
/// dir.sub(name). Returns that directory; a failed quantization is a test failure naming it.
inline std::string QuantizedEmbeddedModel(const TempDir& dir, const std::string& name = "q") {
  nibble::QuantizeRequest r;
  r.model_dir = EmbeddedModel();
  r.output_dir = dir.sub(name);
  const auto q = nibble::Quantize(r);
  EXPECT_TRUE(q.ok()) << q.error().message;
  return r.output_dir;
}

}  // namespace nibble_test
