// bf16-weight GEMV: the scalar reference and every dispatched kernel against a double-precision
// oracle on awkward shapes (K tails of the 64-wide runs and of the 16-lane steps), with a bound
// derived from K and the magnitudes; bit-identity across thread counts; the exact widening used
// for M > 1.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/page_buffer.h"
#include "kernels/bf16_gemv.h"
#include "kernels/int4_dispatch.h"
#include "test_util.h"

namespace nibble {
namespace {

uint16_t ToBf16Bits(float f) {  // truncation: any bf16 pattern is a valid test weight
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

double WidenRef(uint16_t h) {  // written independently of the kernels: sign, exponent, mantissa
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 7) & 0xFF;
  const int man = h & 0x7F;
  if (exp == 0) return sign * std::ldexp(man, -133);  // subnormal: man · 2^(−126−7)
  return sign * std::ldexp(128 + man, exp - 134);      // (1 + man/128) · 2^(exp−127)
}

std::vector<Bf16GemvKernel> Kernels() {
  std::vector<Bf16GemvKernel> out = {GemvBf16Scalar};
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    if (const W4Kernels* k = W4KernelsFor(isa); k != nullptr && k->gemv_bf16 != nullptr) out.push_back(k->gemv_bf16);
  return out;
}

TEST(Bf16GemvTest, EveryKernelMatchesTheDoubleOracleOnTailShapes) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 1.f);
  int cases = 0;
  for (int64_t k : {1, 15, 16, 17, 63, 64, 65, 127, 2048, 2049}) {
    for (int64_t n : {1, 7, 64, 65, 130}) {
      std::vector<uint16_t> w(static_cast<size_t>(n * k));
      for (auto& h : w) h = ToBf16Bits(d(rng) * 0.1f);
      w[0] = ToBf16Bits(300.0f);  // an outlier weight
      std::vector<float> x(static_cast<size_t>(k)), bias(static_cast<size_t>(n));
      for (auto& v : x) v = d(rng);
      for (auto& v : bias) v = d(rng);
      const bool with_bias = cases % 2 == 0;
      for (Bf16GemvKernel kern : Kernels()) {
        std::vector<float> y(static_cast<size_t>(n), std::nanf(""));
        GemvBf16(n, k, w.data(), x.data(), with_bias ? bias.data() : nullptr, y.data(), kern);
        double worst = 0;
        int64_t worst_r = -1;
        for (int64_t r = 0; r < n; ++r) {
          double ref = with_bias ? bias[r] : 0.0, mag = with_bias ? std::fabs(bias[r]) : 0.0;
          for (int64_t i = 0; i < k; ++i) {
            const double p = static_cast<double>(x[i]) * WidenRef(w[r * k + i]);
            ref += p;
            mag += std::fabs(p);
          }
          const double tol = nibble_test::Fp32Gamma(k + 2) * mag + 1e-30;
          const double ratio = std::fabs(y[r] - ref) / tol;
          if (!(ratio <= worst)) worst = ratio, worst_r = r;  // NaN counts as worst
        }
        EXPECT_LE(worst, 1.0) << "K=" << k << " N=" << n << (with_bias ? " bias" : "") << ": worst row " << worst_r;
      }
      ++cases;
    }
  }
}

// Standard-normal bf16 weights [n, k] and x [k], drawn in that order from `seed`.
struct RandomGemv {
  std::vector<uint16_t> w;
  std::vector<float> x;
  RandomGemv(int64_t n, int64_t k, unsigned seed) : w(static_cast<size_t>(n * k)), x(static_cast<size_t>(k)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    for (auto& h : w) h = ToBf16Bits(d(rng));
    for (auto& v : x) v = d(rng);
  }
};

TEST(Bf16GemvTest, ThreadCountDoesNotChangeTheResultAndWideningIsExact) {
  const int64_t n = 300, k = 1000;
  const RandomGemv c(n, k, 9);
  const std::vector<uint16_t>& w = c.w;
  const std::vector<float>& x = c.x;
  for (Bf16GemvKernel kern : Kernels()) {
    std::vector<float> y1(static_cast<size_t>(n)), y2(static_cast<size_t>(n));
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    GemvBf16(n, k, w.data(), x.data(), nullptr, y1.data(), kern);
    omp_set_num_threads(2);
    GemvBf16(n, k, w.data(), x.data(), nullptr, y2.data(), kern);
    omp_set_num_threads(saved);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0);
  }
  std::vector<float> wide(static_cast<size_t>(n * k));
  Bf16ToF32Rows(w.data(), n, k, wide.data());
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(static_cast<double>(wide[i]), WidenRef(w[i])) << i;
}

// The GEMV reads x from an aligned copy when x is misaligned: the same bits at every offset.
TEST(Bf16GemvTest, ResultDoesNotDependOnTheOffsetOfX) {
  const int64_t n = 40, k = 200;
  const RandomGemv c(n, k, 21);
  PageBuffer storage(static_cast<size_t>(k + 16) * sizeof(float));  // 64-byte aligned
  float* const base = reinterpret_cast<float*>(storage.data());
  for (Bf16GemvKernel kern : Kernels()) {
    std::vector<float> y0(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (size_t off = 0; off < 16; ++off) {
      std::memcpy(base + off, c.x.data(), c.x.size() * sizeof(float));
      GemvBf16(n, k, c.w.data(), base + off, nullptr, off == 0 ? y0.data() : y.data(), kern);
      if (off > 0) {
        EXPECT_EQ(std::memcmp(y.data(), y0.data(), y.size() * 4), 0) << "offset " << off;
      }
    }
  }
}

}  // namespace
}  // namespace nibble
