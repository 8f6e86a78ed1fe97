// The packed layout (kernels/int4_packed.h) and every compiled + supported ISA kernel against a
// double-precision reference of the dequantized weight, on shapes with tails (DESIGN.md "Tests"):
// N ∈ {1,7,8,9,63,64,65,4096}, K ∈ {g, 3g, 4096}, M ∈ {1,2,5,32}, g ∈ {32,64,128,K} (+ g not a
// multiple of 32), sym and asym. Tolerance per output: γ_{K+2} · (Σ_k |x_k w_k| + |b|) with
// γ_n = n·u/(1 − n·u), u = 2^-24 — valid for any summation order, since W is bit-identical in
// every path. Also: the dispatch decision on fake CPUs, the NIBBLE_ISA override, bit-identity
// across thread counts, and Int4Linear end to end.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/page_buffer.h"
#include "formats/int4_matrix.h"
#include "test_util.h"
#include "kernels/aligned_acts.h"
#include "kernels/int4_dispatch.h"
#include "kernels/int4_gemm.h"
#include "kernels/int4_packed.h"
#include "kernels/int4_ref.h"
#include "model/int4_linear.h"

namespace nibble {
namespace {

Int4Matrix RandomMatrix(std::mt19937& rng, int64_t n, int64_t k, int64_t g, bool sym) {
  return nibble_test::RandomInt4Matrix(rng, n, k, g, sym);
}

struct Packed {
  std::vector<uint8_t> bytes;
  W4PackedWeight w;
  explicit Packed(const Int4Matrix& m)
      : bytes(static_cast<size_t>(W4PackedBytes(m.n, m.k, m.group_size, m.symmetric))),
        w(PackW4(m.n, m.k, m.group_size, m.symmetric, m.codes.data(), m.scales.data(), m.zero_points.data(),
                 bytes.data())) {}
};

// One random GEMM case: W (N × K, group g) with its reference dequantization and packing, M rows
// of x and a bias, drawn from `rng` in that order.
struct GemmCase {
  Int4Matrix w;
  std::vector<float> wd;
  Packed p;
  std::vector<float> x, bias;
  GemmCase(std::mt19937& rng, std::normal_distribution<float>& xd, int64_t m, int64_t n, int64_t k, int64_t g, bool sym)
      : w(RandomMatrix(rng, n, k, g, sym)), wd(static_cast<size_t>(n * k)), p((DequantizeRef(w, wd.data()), w)),
        x(static_cast<size_t>(m * k)), bias(static_cast<size_t>(n)) {
    for (auto& v : x) v = xd(rng);
    for (auto& v : bias) v = xd(rng);
  }
};

std::vector<const W4Kernels*> SupportedKernels() {
  std::vector<const W4Kernels*> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (const W4Kernels* k = W4KernelsFor(isa)) out.push_back(k);
  return out;
}

// Max over outputs of |y − ref| / tol (<= 1 passes); on failure the message names the worst one.
::testing::AssertionResult WithinTolerance(const Int4Matrix& w, const std::vector<float>& wd, int64_t m,
                                           const std::vector<float>& x, const float* bias, const std::vector<float>& y) {
  const double gamma = nibble_test::Fp32Gamma(w.k + 2);
  double worst = 0, worst_ref = 0, worst_tol = 0;
  int64_t wi = 0, wj = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < w.n; ++j) {
      double ref = 0, mag = 0;
      const float* xr = x.data() + i * w.k;
      const float* wr = wd.data() + j * w.k;
      for (int64_t k = 0; k < w.k; ++k) {
        const double p = static_cast<double>(xr[k]) * wr[k];
        ref += p;
        mag += std::fabs(p);
      }
      if (bias) {
        ref += bias[j];
        mag += std::fabs(bias[j]);
      }
      const double tol = gamma * mag + 1e-30;
      const double v = y[i * w.n + j];
      const double r = std::isfinite(v) ? std::fabs(v - ref) / tol : 1e300;
      if (r > worst) {
        worst = r;
        wi = i;
        wj = j;
        worst_ref = ref;
        worst_tol = tol;
      }
    }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "worst element y[" << wi << "][" << wj << "] = " << y[wi * w.n + wj]
                                       << ", reference " << worst_ref << ", |diff| " << std::fabs(y[wi * w.n + wj] - worst_ref)
                                       << " > tolerance " << worst_tol << " (ratio " << worst << ")";
}

TEST(W4PackedTest, RoundTripAndSizes) {
  std::mt19937 rng(1);
  for (auto [n, k, g] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {3, 32, 32}, {5, 384, 128}, {2, 96, 48}, {4, 100, 100}, {3, 99, 33}, {1, 7, 7}, {2, 64, 16}}) {
    for (bool sym : {false, true}) {
      const Int4Matrix m = RandomMatrix(rng, n, k, g, sym);
      Packed p(m);
      const int64_t rw = g % 16 == 0 ? std::lcm(g, int64_t{128}) : g;
      EXPECT_EQ(p.w.rec_weights, rw);
      EXPECT_EQ(p.w.rec_bytes, (rw / g) * (sym ? 4 : 5) + 64 * ((rw + 127) / 128));
      EXPECT_EQ(static_cast<int64_t>(p.bytes.size()), n * ((k + rw - 1) / rw) * p.w.rec_bytes);
      Int4Matrix back = m;
      std::fill(back.codes.begin(), back.codes.end(), 0);
      UnpackW4(p.w, back.codes.data(), back.scales.data(), back.zero_points.data());
      EXPECT_EQ(back, m) << "n=" << n << " k=" << k << " g=" << g << " sym=" << sym;
    }
  }
  // Bytes per weight: g128 68/128 (sym) and 69/128 (asym); g32 80/128 and 84/128.
  EXPECT_EQ(W4PackedBytes(1, 128, 128, true), 68);
  EXPECT_EQ(W4PackedBytes(1, 128, 128, false), 69);
  EXPECT_EQ(W4PackedBytes(1, 128, 32, true), 80);
  EXPECT_EQ(W4PackedBytes(1, 128, 32, false), 84);
}

TEST(W4PackedTest, WorkedExampleFromDocs) {
  // docs/KERNELS.md: one row, K = 128, g = 64, asym, scales {0.5, 0.25}, zero points {3, 12},
  // q[k] = k / 16 (so run j holds code j in all 16 lanes).
  Int4Matrix m;
  m.n = 1;
  m.k = 128;
  m.group_size = 64;
  m.codes.resize(128);
  for (int i = 0; i < 128; ++i) m.codes[i] = static_cast<uint8_t>(i / 16);
  m.scales = {0.5f, 0.25f};
  m.zero_points = {3, 12};
  Packed p(m);
  ASSERT_EQ(p.bytes.size(), 74u);
  const uint8_t head[10] = {0x00, 0x00, 0x00, 0x3F, 0x00, 0x00, 0x80, 0x3E, 0x03, 0x0C};
  EXPECT_EQ(std::memcmp(p.bytes.data(), head, 10), 0);
  for (int l = 0; l < 16; ++l) {
    const uint8_t dword[4] = {0x10, 0x32, 0x54, 0x76};
    EXPECT_EQ(std::memcmp(p.bytes.data() + 10 + 4 * l, dword, 4), 0) << "lane " << l;
  }
}

TEST(W4KernelTest, ScalarPackedIsBitIdenticalToReference) {
  std::mt19937 rng(2);
  std::normal_distribution<float> xd(0.f, 1.f);
  for (auto [m, n, k, g] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {1, 9, 96, 32}, {3, 7, 384, 128}, {2, 5, 100, 100}, {2, 3, 96, 48}}) {
    const Int4Matrix w = RandomMatrix(rng, n, k, g, false);
    Packed p(w);
    std::vector<float> x(static_cast<size_t>(m * k)), bias(static_cast<size_t>(n));
    for (auto& v : x) v = xd(rng);
    for (auto& v : bias) v = xd(rng);
    std::vector<float> y0(static_cast<size_t>(m * n)), y1(y0.size());
    W4GemmArgs ra{m, n, k, g, x.data(), w.codes.data(), w.scales.data(), w.zero_points.data(), bias.data(), y0.data()};
    GemmW4A32Ref(ra);
    W4PackedGemmArgs pa{m, &p.w, x.data(), bias.data(), y1.data()};
    GemmW4A32PackedScalar(pa, 0, n);
    EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << "m=" << m << " n=" << n << " k=" << k;
  }
}

// The cross product of the shapes, with the expensive corner (N = 4096 with K = 4096 and
// large M) thinned so the binary stays fast on 2 cores.
TEST(W4KernelTest, EveryIsaMatchesReferenceOnTailShapes) {
  const auto isas = SupportedKernels();
  ASSERT_FALSE(isas.empty());
  std::mt19937 rng(3);
  std::normal_distribution<float> xd(0.f, 1.f);
  int cases = 0;
  for (int64_t g : {32, 64, 128, 0 /* per-channel */, 48 /* tail path */}) {
    for (int64_t kk : {1, 3, 4096}) {
      const int64_t k = kk == 4096 ? (g == 48 ? 4080 : 4096) : (g == 0 ? 96 * kk : g * kk);
      const int64_t gs = g == 0 ? k : g;
      for (int64_t n : {1, 7, 8, 9, 63, 64, 65, 4096}) {
        for (int64_t m : {1, 2, 5, 32}) {
          if (n * k * m > (int64_t{1} << 23) && !(n == 4096 && k == 4096 && m == 1 && gs == 128)) continue;
          const bool sym = ((n + m + kk) % 2) == 0;
          GemmCase c(rng, xd, m, n, k, gs, sym);
          const bool with_bias = cases % 3 == 0;
          for (const W4Kernels* kern : isas) {
            std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
            W4PackedGemmArgs a{m, &c.p.w, c.x.data(), with_bias ? c.bias.data() : nullptr, y.data()};
            GemmW4A32Packed(a, kern);
            EXPECT_TRUE(WithinTolerance(c.w, c.wd, m, c.x, with_bias ? c.bias.data() : nullptr, y))
                << IsaName(kern->isa) << " M=" << m << " N=" << n << " K=" << k << " g=" << gs
                << (sym ? " sym" : " asym") << (with_bias ? " bias" : "");
            std::vector<float> d(static_cast<size_t>(n * k));
            if (m == 1) {
              DequantW4Packed(c.p.w, d.data(), kern);
              EXPECT_EQ(std::memcmp(d.data(), c.wd.data(), d.size() * 4), 0) << IsaName(kern->isa) << " dequant";
            }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 300);
}

// The AVX-512 GEMV streams one row at a time while x fits L1 (K <= 8192) and tiles rows above
// that: both sides of the switch, every group size that takes 128-weight records, sym and asym.
TEST(W4KernelTest, GemvOnBothSidesOfTheRowStreamingLimit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> xd(0.f, 1.f);
  for (int64_t g : {32, 64, 128, 256}) {
    for (int64_t k : {int64_t{8192}, int64_t{8448}}) {
      for (int64_t n : {1, 9, 65}) {
        for (bool sym : {true, false}) {
          GemmCase c(rng, xd, 1, n, k, g, sym);
          for (const W4Kernels* kern : SupportedKernels()) {
            std::vector<float> y(static_cast<size_t>(n), std::nanf(""));
            W4PackedGemmArgs a{1, &c.p.w, c.x.data(), c.bias.data(), y.data()};
            GemmW4A32Packed(a, kern);
            EXPECT_TRUE(WithinTolerance(c.w, c.wd, 1, c.x, c.bias.data(), y))
                << IsaName(kern->isa) << " N=" << n << " K=" << k << " g=" << g << (sym ? " sym" : " asym");
          }
        }
      }
    }
  }
}

// The AVX2 kernel's documented order, written out in scalar code: per output an 8-lane
// accumulator, per 16-weight run lane l takes fma(x[k + l], w[k + l]) then fma(x[k + 8 + l],
// w[k + 8 + l]) (w the reference's dequantized value), lanes reduced as ((l + 4), then the
// high pair onto the low, then lane 1 onto lane 0), + bias.
float Avx2OrderModel(const float* x, const float* wrow, int64_t k, const float* bias) {
  float acc[8] = {};
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(x[k0 + l], wrow[k0 + l], acc[l]);
    for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(x[k0 + 8 + l], wrow[k0 + 8 + l], acc[l]);
  }
  float s4[4];
  for (int l = 0; l < 4; ++l) s4[l] = acc[l] + acc[l + 4];
  const float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
  const float v = s0 + s1;
  return bias != nullptr ? v + *bias : v;
}

// The AVX2 decode loop's order (M = 1, g = 128): per group four 8-lane chains, chain j mod 4 taking
// run j's codes 16j + l, then 16j + 8 + l (float(q), exact; the chain's first step a product,
// then FMAs); sum[gi mod 4] = fma(s, (c0 + c1) + (c2 + c3), sum[gi mod 4]); the zero point in
// scalar, corr = fma(s, float(z) · σ, corr), σ the group's Σx (8 lanes over its 16 loads in
// order, then the lane tree); at the end ((sum0 + sum1) + (sum2 + sum3)), the same lane tree as
// above, − corr, + bias.
float Avx2DecodeOrderModel(const Int4Matrix& w, int64_t row, const float* x, const float* bias) {
  const auto tree = [](const float* v8) {
    float s4[4];
    for (int l = 0; l < 4; ++l) s4[l] = v8[l] + v8[l + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
  };
  const int64_t groups = w.k / 128;
  float sum[4][8] = {}, corr = 0.f;
  for (int64_t gi = 0; gi < groups; ++gi) {
    float c[4][8], sig8[8];
    for (int l = 0; l < 8; ++l) sig8[l] = x[128 * gi + l];
    for (int j = 1; j < 16; ++j)
      for (int l = 0; l < 8; ++l) sig8[l] += x[128 * gi + 8 * j + l];
    const int z = w.zero_points[static_cast<size_t>(row * groups + gi)];
    for (int j = 0; j < 8; ++j)
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 8; ++l) {
          const int64_t kk = 128 * gi + 16 * j + 8 * h + l;
          const float wv = static_cast<float>(w.codes[static_cast<size_t>(row * w.k + kk)]);
          float& cc = c[j % 4][l];
          cc = (j < 4 && h == 0) ? x[kk] * wv : std::fmaf(x[kk], wv, cc);
        }
    const float s = w.scales[static_cast<size_t>(row * groups + gi)];
    for (int l = 0; l < 8; ++l) sum[gi % 4][l] = std::fmaf(s, (c[0][l] + c[1][l]) + (c[2][l] + c[3][l]), sum[gi % 4][l]);
    corr = std::fmaf(s, static_cast<float>(z) * tree(sig8), corr);
  }
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = (sum[0][l] + sum[1][l]) + (sum[2][l] + sum[3][l]);
  const float v = tree(acc) - corr;
  return bias != nullptr ? v + *bias : v;
}

// The AVX2 kernel bit for bit against those models (so any change to its loops that keeps the
// arithmetic, like the group counter instead of a division per run, is checked exactly): every
// group size it serves, K with partial records, rows in and past 4-row tiles, M = 1 (the decode
// loop at g = 128) and 2-row tiles plus a tail row.
TEST(W4KernelTest, Avx2KernelIsBitIdenticalToItsScalarOrderModel) {
  const W4Kernels* avx2 = W4KernelsFor(Isa::kAvx2);
  if (avx2 == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(12);
  std::normal_distribution<float> xd(0.f, 1.f);
  int cases = 0;
  for (int64_t g : {16, 32, 48, 64, 128, 256}) {
    for (int64_t k : {g, 3 * g, 2 * 128 * g / std::gcd(g, int64_t{128}) + g}) {
      for (int64_t n : {1, 5, 9}) {
        for (int64_t m : {1, 3}) {
          const bool sym = (n + m) % 2 == 0;
          GemmCase c(rng, xd, m, n, k, g, sym);
          std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
          W4PackedGemmArgs a{m, &c.p.w, c.x.data(), c.bias.data(), y.data()};
          GemmW4A32Packed(a, avx2);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              const float want = m == 1 && g == 128
                                     ? Avx2DecodeOrderModel(c.w, j, c.x.data(), c.bias.data() + j)
                                     : Avx2OrderModel(c.x.data() + i * k, c.wd.data() + j * k, k, c.bias.data() + j);
              const float got = y[static_cast<size_t>(i * n + j)];
              EXPECT_EQ(std::memcmp(&got, &want, 4), 0) << "y[" << i << "][" << j << "] = " << got << ", model " << want
                                                        << " (g=" << g << " K=" << k << " N=" << n << " M=" << m << ")";
            }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 6 * 3 * 3 * 2);
}

// Past the decode loop's group sums on the stack (1024 groups of 128: K > 131072) one row at
// g = 128 runs the tiles, in their order.
TEST(W4KernelTest, Avx2DecodePastItsGroupSumsRunsTheTiles) {
  const W4Kernels* avx2 = W4KernelsFor(Isa::kAvx2);
  if (avx2 == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(13);
  std::normal_distribution<float> xd(0.f, 1.f);
  for (int64_t k : {int64_t{1024 * 128}, int64_t{1025 * 128}}) {
    GemmCase c(rng, xd, 1, 3, k, 128, false);
    std::vector<float> y(3, std::nanf(""));
    W4PackedGemmArgs a{1, &c.p.w, c.x.data(), c.bias.data(), y.data()};
    GemmW4A32Packed(a, avx2);
    for (int64_t j = 0; j < 3; ++j) {
      const float want = k <= 1024 * 128 ? Avx2DecodeOrderModel(c.w, j, c.x.data(), c.bias.data() + j)
                                         : Avx2OrderModel(c.x.data(), c.wd.data() + j * k, k, c.bias.data() + j);
      EXPECT_EQ(std::memcmp(&y[static_cast<size_t>(j)], &want, 4), 0) << "K=" << k << " row " << j;
    }
  }
}

CpuFeatures FakeCpu(bool avx2, bool avx512, bool os_zmm) {
  CpuFeatures c;
  c.vendor = "FakeCPU";
  c.osxsave = true;
  c.os_ymm = true;
  c.os_zmm = os_zmm;
  c.avx = c.fma = c.f16c = c.avx2 = avx2;
  c.avx512f = c.avx512bw = c.avx512vl = c.avx512dq = avx512;
  return c;
}

TEST(W4DispatchTest, FakeCpusAndOverride) {
#if defined(__x86_64__)
  const CpuFeatures full = FakeCpu(true, true, true);
  EXPECT_EQ(ResolveW4Dispatch(full, nullptr).kernels.isa, Isa::kAvx512);
  EXPECT_EQ(ResolveW4Dispatch(full, "").kernels.isa, Isa::kAvx512);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const W4Dispatch d = ResolveW4Dispatch(full, IsaName(isa));
    EXPECT_EQ(d.kernels.isa, isa);
    EXPECT_TRUE(d.message.empty()) << d.message;
  }
  // The OS does not save ZMM state: AVX-512 is refused even though CPUID has it.
  const W4Dispatch noz = ResolveW4Dispatch(FakeCpu(true, true, false), "avx512");
  EXPECT_EQ(noz.kernels.isa, Isa::kAvx2);
  EXPECT_NE(noz.message.find("ZMM"), std::string::npos) << noz.message;
  // AVX2-only CPU.
  const W4Dispatch a2 = ResolveW4Dispatch(FakeCpu(true, false, false), nullptr);
  EXPECT_EQ(a2.kernels.isa, Isa::kAvx2);
  EXPECT_NE(a2.candidates[0].reason.find("avx512f"), std::string::npos) << a2.candidates[0].reason;
  // The int8 (W4A8) kernel and why: VNNI needs AVX-512 chosen and avx512_vnni; AVX2 (also on
  // AVX-512 without VNNI) runs vpmaddubsw; only the scalar ISA runs the scalar kernel.
  EXPECT_STREQ(ResolveW4Dispatch(full, nullptr).kernels.gemm_i8_name, "avx2");  // FakeCpu: no avx512_vnni
  EXPECT_EQ(ResolveW4Dispatch(full, nullptr).gemm_i8_reason, "CPU lacks avx512_vnni: vpmaddubsw on avx2");
  EXPECT_STREQ(a2.kernels.gemm_i8_name, "avx2");
  CpuFeatures vnni = full;
  vnni.avx512vnni = true;
  EXPECT_STREQ(ResolveW4Dispatch(vnni, nullptr).kernels.gemm_i8_name, "avx512_vnni");
  EXPECT_EQ(ResolveW4Dispatch(vnni, nullptr).gemm_i8_reason, "avx512 with avx512_vnni");
  EXPECT_STREQ(ResolveW4Dispatch(vnni, "avx2").kernels.gemm_i8_name, "avx2");
  EXPECT_EQ(ResolveW4Dispatch(vnni, "avx2").gemm_i8_reason, "ISA avx2: vpmaddubsw");
  EXPECT_STREQ(ResolveW4Dispatch(vnni, "scalar").kernels.gemm_i8_name, "scalar");
  EXPECT_EQ(ResolveW4Dispatch(vnni, "scalar").gemm_i8_reason, "no vector W4A8 kernel for ISA scalar");
  // The bf16-activation kernel and why: AVX-512 chosen with avx512_bf16 and avx512_vbmi, else none
  // (Int4Linear then runs the W4A32 kernels on bf16-rounded inputs).
  EXPECT_EQ(ResolveW4Dispatch(full, nullptr).kernels.gemm_bf16, nullptr);
  EXPECT_NE(ResolveW4Dispatch(full, nullptr).gemm_bf16_reason.find("CPU lacks avx512_bf16"), std::string::npos);
  CpuFeatures bf = full;
  bf.avx512bf16 = true;
  EXPECT_EQ(ResolveW4Dispatch(bf, nullptr).kernels.gemm_bf16, nullptr);  // no vbmi yet
  EXPECT_NE(ResolveW4Dispatch(bf, nullptr).gemm_bf16_reason.find("CPU lacks avx512_vbmi"), std::string::npos);
  bf.avx512vbmi = true;
  EXPECT_NE(ResolveW4Dispatch(bf, nullptr).kernels.gemm_bf16, nullptr);
  EXPECT_STREQ(ResolveW4Dispatch(bf, nullptr).kernels.gemm_bf16_name, "avx512_bf16");
  EXPECT_EQ(ResolveW4Dispatch(bf, nullptr).gemm_bf16_reason, "avx512 with avx512_bf16 and avx512_vbmi");
  EXPECT_EQ(ResolveW4Dispatch(bf, "avx2").kernels.gemm_bf16, nullptr);
  EXPECT_NE(ResolveW4Dispatch(bf, "avx2").gemm_bf16_reason.find("no AVX-512 BF16 kernel for ISA avx2"), std::string::npos);
  // The AMX tile kernel: with the bf16 kernel, amx_tile + amx_bf16 and the OS's tile state.
  EXPECT_EQ(ResolveW4Dispatch(bf, nullptr).kernels.gemm_bf16_amx, nullptr);
  CpuFeatures amx = bf;
  amx.amx_tile = amx.amx_bf16 = true;
  EXPECT_EQ(ResolveW4Dispatch(amx, nullptr).kernels.gemm_bf16_amx, nullptr);  // no tile state granted
  amx.os_amx = true;
  EXPECT_NE(ResolveW4Dispatch(amx, nullptr).kernels.gemm_bf16_amx, nullptr);
  EXPECT_NE(ResolveW4Dispatch(amx, nullptr).gemm_bf16_reason.find("AMX tiles from 4 rows"), std::string::npos);
  EXPECT_EQ(ResolveW4Dispatch(amx, "avx2").kernels.gemm_bf16_amx, nullptr);
  amx.avx512vbmi = false;  // no AVX-512 BF16 kernel: no tile kernel either
  EXPECT_EQ(ResolveW4Dispatch(amx, nullptr).kernels.gemm_bf16_amx, nullptr);
  // bf16 prefill on the fp32 sgemm: Intel with the bf16 kernel and without AMX only.
  CpuFeatures intel = bf;
  intel.vendor = "GenuineIntel";
  EXPECT_FALSE(ResolveW4Dispatch(bf, nullptr).kernels.bf16_prefill_sgemm);  // FakeCPU
  EXPECT_TRUE(ResolveW4Dispatch(intel, nullptr).kernels.bf16_prefill_sgemm);
  EXPECT_NE(ResolveW4Dispatch(intel, nullptr).gemm_bf16_reason.find("prefill on the fp32 sgemm"), std::string::npos);
  intel.amx_tile = intel.amx_bf16 = intel.os_amx = true;
  EXPECT_FALSE(ResolveW4Dispatch(intel, nullptr).kernels.bf16_prefill_sgemm);
  // The decode loop's unpack by shifts: Zen 4 (AuthenticAMD family 0x19) only.
  CpuFeatures zen4 = bf, zen5 = bf;
  zen4.vendor = zen5.vendor = "AuthenticAMD";
  zen4.family = 0x19;
  zen5.family = 0x1A;
  const W4Dispatch z4 = ResolveW4Dispatch(zen4, nullptr);
  EXPECT_NE(z4.gemm_bf16_reason.find("unpacking by shifts (Zen 4"), std::string::npos) << z4.gemm_bf16_reason;
  EXPECT_NE(z4.kernels.gemm_bf16, ResolveW4Dispatch(zen5, nullptr).kernels.gemm_bf16);
  EXPECT_EQ(ResolveW4Dispatch(zen5, nullptr).gemm_bf16_reason, "avx512 with avx512_bf16 and avx512_vbmi");
  EXPECT_EQ(ResolveW4Dispatch(zen5, nullptr).kernels.gemm_bf16, ResolveW4Dispatch(bf, nullptr).kernels.gemm_bf16);
  EXPECT_EQ(z4.kernels.bf16_unpack, W4Bf16Unpack::kShift);
  EXPECT_EQ(ResolveW4Dispatch(zen5, nullptr).kernels.bf16_unpack, W4Bf16Unpack::kMultishift);
  // NIBBLE_BF16_UNPACK forces either; an unknown value keeps the automatic choice and says why.
  const W4Dispatch forced_shift = ResolveW4Dispatch(zen5, nullptr, nullptr, "shift");
  EXPECT_EQ(forced_shift.kernels.bf16_unpack, W4Bf16Unpack::kShift);
  EXPECT_EQ(forced_shift.kernels.gemm_bf16, z4.kernels.gemm_bf16);
  EXPECT_NE(forced_shift.gemm_bf16_reason.find("forced by NIBBLE_BF16_UNPACK=shift"), std::string::npos);
  const W4Dispatch forced_ms = ResolveW4Dispatch(zen4, nullptr, nullptr, "multishift");
  EXPECT_EQ(forced_ms.kernels.bf16_unpack, W4Bf16Unpack::kMultishift);
  EXPECT_NE(forced_ms.gemm_bf16_reason.find("vpmultishiftqb (forced"), std::string::npos) << forced_ms.gemm_bf16_reason;
  const W4Dispatch bad_unpack = ResolveW4Dispatch(zen4, nullptr, nullptr, "nibbles");
  EXPECT_EQ(bad_unpack.kernels.bf16_unpack, W4Bf16Unpack::kShift);
  EXPECT_NE(bad_unpack.bf16_unpack_message.find("\"nibbles\""), std::string::npos) << bad_unpack.bf16_unpack_message;
  intel.amx_tile = intel.amx_bf16 = intel.os_amx = false;  // FMA blocks with the shift unpack
  EXPECT_TRUE(ResolveW4Dispatch(intel, nullptr, nullptr, "shift").kernels.bf16_prefill_sgemm);
  EXPECT_NE(ResolveW4Dispatch(intel, nullptr, nullptr, "shift").kernels.gemm_bf16,
            ResolveW4Dispatch(intel, nullptr).kernels.gemm_bf16);
  // Nothing: scalar.
  EXPECT_EQ(ResolveW4Dispatch(FakeCpu(false, false, false), nullptr).kernels.isa, Isa::kScalar);
  EXPECT_EQ(ResolveW4Dispatch(FakeCpu(false, false, false), "avx2").kernels.isa, Isa::kScalar);
#endif
  // Unknown value: automatic choice and a message naming it.
  const W4Dispatch bad = ResolveW4Dispatch(DetectCpuFeatures(), "sse9");
  EXPECT_NE(bad.message.find("sse9"), std::string::npos);
  EXPECT_EQ(bad.kernels.isa, ResolveW4Dispatch(DetectCpuFeatures(), nullptr).kernels.isa);
}

TEST(W4DispatchTest, DecodePrefetchByVendorAndOverride) {
  CpuFeatures intel = FakeCpu(true, true, true), amd = intel;
  intel.vendor = "GenuineIntel";
  amd.vendor = "AuthenticAMD";
  EXPECT_EQ(ResolveW4Dispatch(intel, nullptr).kernels.row_prefetch, StreamPrefetch::kL1);
  EXPECT_EQ(ResolveW4Dispatch(intel, nullptr).prefetch_reason, "GenuineIntel");
  EXPECT_EQ(ResolveW4Dispatch(amd, nullptr).kernels.row_prefetch, StreamPrefetch::kNonTemporal);
  EXPECT_EQ(ResolveW4Dispatch(amd, nullptr, "").kernels.row_prefetch, StreamPrefetch::kNonTemporal);
  EXPECT_EQ(ResolveW4Dispatch(intel, nullptr, "nta").kernels.row_prefetch, StreamPrefetch::kNonTemporal);
  EXPECT_EQ(ResolveW4Dispatch(amd, nullptr, "t0").kernels.row_prefetch, StreamPrefetch::kL1);
  EXPECT_EQ(ResolveW4Dispatch(amd, nullptr, "t0").prefetch_reason, "forced by NIBBLE_PREFETCH=t0");
  EXPECT_TRUE(ResolveW4Dispatch(amd, nullptr, "t0").prefetch_message.empty());
  // An unknown hint: the vendor's choice, and a message naming the value.
  const W4Dispatch bad = ResolveW4Dispatch(intel, nullptr, "t1");
  EXPECT_EQ(bad.kernels.row_prefetch, StreamPrefetch::kL1);
  EXPECT_NE(bad.prefetch_message.find("\"t1\""), std::string::npos) << bad.prefetch_message;
  // The hint goes with every ISA's table (only the AVX-512 loops use it).
  EXPECT_EQ(ResolveW4Dispatch(intel, "avx2").kernels.row_prefetch, StreamPrefetch::kL1);
}

// The prefetch hint moves no bits: the decode kernels of both hints (fp32 row GEMV, int8 and bf16
// decode loops at g = 128) against each other on the real CPU, M = 1, K past one prefetch distance.
TEST(W4DispatchTest, BothDecodePrefetchHintsGiveTheSameBits) {
  std::mt19937 rng(46);
  std::normal_distribution<float> xd(0.f, 1.f);
  const int64_t n = 37, k = 128 * 40;
  for (bool sym : {false, true}) {
    const Int4Matrix w = RandomMatrix(rng, n, k, 128, sym);
    Packed p(w);
    std::vector<float> x(static_cast<size_t>(k)), bias(static_cast<size_t>(n));
    for (auto& v : x) v = xd(rng);
    for (auto& v : bias) v = xd(rng);
    const CpuFeatures cpu = DetectCpuFeatures();
    const W4Dispatch nta = ResolveW4Dispatch(cpu, nullptr, "nta"), t0 = ResolveW4Dispatch(cpu, nullptr, "t0");
    ASSERT_EQ(nta.kernels.row_prefetch, StreamPrefetch::kNonTemporal);
    ASSERT_EQ(t0.kernels.row_prefetch, StreamPrefetch::kL1);
    std::vector<float> y0(static_cast<size_t>(n)), y1(y0.size());
    W4PackedGemmArgs a0{1, &p.w, x.data(), bias.data(), y0.data()}, a1{1, &p.w, x.data(), bias.data(), y1.data()};
    GemmW4A32Packed(a0, &nta.kernels);
    GemmW4A32Packed(a1, &t0.kernels);
    EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << "fp32 sym=" << sym;
    std::vector<uint8_t> s8(W4Int8ActsBytes(k, 1));
    const W4Int8Acts a8 = QuantizeActsInt8(x.data(), k, 1, s8.data());
    GemmW4A8Packed(p.w, &a8, 1, bias.data(), y0.data(), &nta.kernels);
    GemmW4A8Packed(p.w, &a8, 1, bias.data(), y1.data(), &t0.kernels);
    EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << "int8 sym=" << sym;
    if (nta.kernels.gemm_bf16 == nullptr) continue;
    PageBuffer sb(W4Bf16ActsBytes(k, 128));
    const W4Bf16Acts ab = PrepareActsBf16(x.data(), k, 128, sb.data());
    GemmW4Bf16Packed(p.w, &ab, 1, bias.data(), y0.data(), &nta.kernels);
    GemmW4Bf16Packed(p.w, &ab, 1, bias.data(), y1.data(), &t0.kernels);
    EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << "bf16 sym=" << sym;
  }
}

TEST(W4DispatchTest, ForcingEachIsaComputesTheSameProduct) {
  // Each ISA through the override on the real CPU (where supported), including scalar.
  std::mt19937 rng(4);
  std::normal_distribution<float> xd(0.f, 1.f);
  const Int4Matrix w = RandomMatrix(rng, 65, 384, 128, false);
  std::vector<float> wd(static_cast<size_t>(65 * 384));
  DequantizeRef(w, wd.data());
  Packed p(w);
  std::vector<float> x(3 * 384);
  for (auto& v : x) v = xd(rng);
  const CpuFeatures cpu = DetectCpuFeatures();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const W4Dispatch d = ResolveW4Dispatch(cpu, IsaName(isa));
    if (W4KernelsFor(isa) == nullptr) {
      EXPECT_FALSE(d.message.empty());
      continue;
    }
    EXPECT_EQ(d.kernels.isa, isa);
    std::vector<float> y(3 * 65);
    W4PackedGemmArgs a{3, &p.w, x.data(), nullptr, y.data()};
    GemmW4A32Packed(a, &d.kernels);
    EXPECT_TRUE(WithinTolerance(w, wd, 3, x, nullptr, y)) << IsaName(isa);
  }
}

TEST(StreamReadTest, EveryIsaSumsEveryWordAtAnyOffsetAndLength) {
  // The bandwidth roofline's read kernels: wrapping 64-bit sum, unaligned starts, tails.
  std::mt19937_64 rng(9);
  std::vector<uint64_t> buf(1000);
  for (auto& v : buf) v = rng();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const W4Kernels* k = W4KernelsFor(isa);
    if (k == nullptr) continue;
    ASSERT_NE(k->stream_read, nullptr) << IsaName(isa);
    for (int64_t off : {0, 1, 3})
      for (int64_t words : {0, 1, 15, 16, 31, 32, 33, 100, 997 - 3}) {
        uint64_t want = 0;
        for (int64_t i = 0; i < words; ++i) want += buf[static_cast<size_t>(off + i)];
        EXPECT_EQ(k->stream_read(buf.data() + off, words), want) << IsaName(isa) << " off " << off << " words " << words;
      }
  }
}

TEST(W4ThreadsTest, BitIdenticalForOneAndTwoThreads) {
  std::mt19937 rng(5);
  std::normal_distribution<float> xd(0.f, 1.f);
  const Int4Matrix w = RandomMatrix(rng, 1000, 512, 128, false);
  Packed p(w);
  const int saved = omp_get_max_threads();
  for (const W4Kernels* kern : SupportedKernels()) {
    for (int64_t m : {1, 5, 70}) {
      std::vector<float> x(static_cast<size_t>(m * 512));
      for (auto& v : x) v = xd(rng);
      std::vector<float> y1(static_cast<size_t>(m * 1000)), y2(y1.size());
      omp_set_num_threads(1);
      GemmW4A32Packed({m, &p.w, x.data(), nullptr, y1.data()}, kern);
      omp_set_num_threads(2);
      GemmW4A32Packed({m, &p.w, x.data(), nullptr, y2.data()}, kern);
      EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << IsaName(kern->isa) << " m=" << m;
    }
  }
  omp_set_num_threads(saved);
}

// AlignedActs hands the kernels a 64-byte-aligned x: the same pointer when x already is, else an
// exact copy; and the products do not depend on where x sits (every float offset within a line).
TEST(AlignedActsTest, CopiesOnlyMisalignedRowsExactly) {
  alignas(64) float buf[16 + 300];
  for (int i = 0; i < 316; ++i) buf[i] = static_cast<float>(i) * 0.37f - 11.f;
  EXPECT_EQ(AlignedActs(buf, 300), buf);
  EXPECT_EQ(AlignedActs(nullptr, 0), nullptr);
  for (int off = 1; off < 16; ++off) {
    const float* a = AlignedActs(buf + off, 300);
    ASSERT_NE(a, buf + off) << off;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kActsAlignment, 0u) << off;
    EXPECT_EQ(std::memcmp(a, buf + off, 300 * sizeof(float)), 0) << off;
  }
}

TEST(AlignedActsTest, ProductsDoNotDependOnTheOffsetOfX) {
  std::mt19937 rng(17);
  std::normal_distribution<float> xd(0.f, 1.f);
  const int64_t n = 48, k = 384;
  for (int64_t g : {32, 128}) {
    const Int4Matrix w = RandomMatrix(rng, n, k, g, false);
    Packed p(w);
    for (const W4Kernels* kern : SupportedKernels())
      for (int64_t m : {1, 3}) {
        PageBuffer storage(static_cast<size_t>(m * k + 16) * sizeof(float));  // 64-byte aligned
        std::vector<float> x(static_cast<size_t>(m * k));
        for (auto& v : x) v = xd(rng);
        std::vector<float> y0(static_cast<size_t>(m * n)), y(y0.size());
        // Offset 0 (a 64-byte boundary), then every other float offset within the line.
        for (size_t off = 0; off < 16; ++off) {
          float* xp = reinterpret_cast<float*>(storage.data()) + off;
          std::memcpy(xp, x.data(), x.size() * sizeof(float));
          GemmW4A32Packed({m, &p.w, xp, nullptr, off == 0 ? y0.data() : y.data()}, kern);
          if (off > 0) {
            EXPECT_EQ(std::memcmp(y.data(), y0.data(), y.size() * sizeof(float)), 0)
                << IsaName(kern->isa) << " g=" << g << " m=" << m << " offset " << off;
          }
        }
      }
  }
}

// PackW4 splits rows over threads above 2^20 weights: same bytes as one thread, and unpacks back.
TEST(W4PackedTest, ThreadedPackIsIdenticalToOneThread) {
  std::mt19937 rng(8);
  for (bool sym : {true, false}) {
    const Int4Matrix w = RandomMatrix(rng, 600, 2048, 64, sym);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    Packed p1(w);
    omp_set_num_threads(2);
    Packed p2(w);
    omp_set_num_threads(saved);
    ASSERT_EQ(p1.bytes.size(), p2.bytes.size());
    EXPECT_EQ(std::memcmp(p1.bytes.data(), p2.bytes.data(), p1.bytes.size()), 0) << (sym ? "sym" : "asym");
    std::vector<uint8_t> codes(w.codes.size()), zp(w.zero_points.size());
    std::vector<float> scales(w.scales.size());
    UnpackW4(p2.w, codes.data(), scales.data(), zp.data());
    EXPECT_TRUE(codes == w.codes && scales == w.scales);
  }
}

TEST(Int4LinearTest, ForwardAndWeightRoundTrip) {
  std::mt19937 rng(6);
  std::normal_distribution<float> xd(0.f, 1.f);
  const Int4Matrix w = RandomMatrix(rng, 72, 256, 64, true);
  std::vector<float> wd(static_cast<size_t>(72 * 256));
  DequantizeRef(w, wd.data());
  std::vector<float> bias(72);
  for (auto& v : bias) v = xd(rng);
  Int4Linear lin(w, bias, "test");
  EXPECT_EQ(lin.weight(), w);
  EXPECT_EQ(lin.WeightBytes(), 72 * 2 * (2 * 4 + 64));
  for (int64_t m : {int64_t{1}, int64_t{7}, Int4Linear::kDequantGemmMinRows + 3}) {
    std::vector<float> x(static_cast<size_t>(m * 256)), y(static_cast<size_t>(m * 72));
    for (auto& v : x) v = xd(rng);
    lin.Forward(x.data(), m, y.data());
    EXPECT_TRUE(WithinTolerance(w, wd, m, x, bias.data(), y)) << "m=" << m;
  }
}

// ---------------------------------------------------------------------------------------------
// Opt-in W4A8 path (int8 activations).

// Independent oracle: x quantized per 128-value block with its own code (scale max|x|/127,
// round half to even), W dequantized from the Int4Matrix, products summed in double. Also the
// tolerance per output: the kernels round s·xs, each fma and each block/part sum in fp32, and
// accumulate q·x̂ and the zero-point term z·x̂ apart before subtracting them, so
// |y − oracle| <= γ_{K/16 + 8} · (Σ_k s_k (|q_k x̂_k| + |z_k x̂_k|) + |b|).
struct W4A8Ref {
  std::vector<double> y, tol;
};

W4A8Ref W4A8Oracle(const Int4Matrix& m, const std::vector<float>& x, const float* bias) {
  std::vector<double> xq(static_cast<size_t>(m.k));
  for (int64_t t = 0; t * 128 < m.k; ++t) {
    const int64_t k0 = 128 * t, k1 = std::min<int64_t>(m.k, k0 + 128);
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float scale = amax / 127.f;
    for (int64_t k = k0; k < k1; ++k) {
      const double q = amax > 0.f ? std::nearbyint(static_cast<double>(x[k] * (127.f / amax))) : 0.0;
      xq[k] = std::clamp(q, -127.0, 127.0) * scale;
    }
  }
  std::vector<float> wd(static_cast<size_t>(m.n * m.k));
  DequantizeRef(m, wd.data());
  const double gamma = nibble_test::Fp32Gamma(m.k / 16 + 8);
  W4A8Ref r;
  for (int64_t n = 0; n < m.n; ++n) {
    double acc = 0, mag = 0;
    for (int64_t k = 0; k < m.k; ++k) {
      acc += static_cast<double>(wd[n * m.k + k]) * xq[k];
      const size_t gi = static_cast<size_t>(n * m.groups() + k / m.group_size);
      mag += static_cast<double>(m.scales[gi]) * std::fabs(xq[k]) *
             (m.codes[static_cast<size_t>(n * m.k + k)] + static_cast<double>(m.zero_points[gi]));
    }
    if (bias != nullptr) {
      acc += bias[n];
      mag += std::fabs(bias[n]);
    }
    r.y.push_back(acc);
    r.tol.push_back(gamma * mag + 1e-30);
  }
  return r;
}

TEST(W4A8KernelTest, EveryKernelMatchesTheOracleAndIsBitIdenticalToScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> xd(0.f, 1.f);
  const W4Kernels* scalar = W4KernelsFor(Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  // VNNI when the CPU has it (else AVX2 again), and AVX2 (vpmaddubsw).
  std::vector<const W4Kernels*> fasts;
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2})
    if (const W4Kernels* k = W4KernelsFor(isa)) fasts.push_back(k);
  int cases = 0;
  for (int64_t g : {32, 64, 128, 256, -1}) {
    for (int64_t kmul : {1, 3, 0}) {
      const int64_t k = g == -1 ? (kmul == 0 ? 4096 : 128 * kmul) : (kmul == 0 ? 4096 : g * kmul);
      const int64_t ge = g == -1 ? k : g;
      for (int64_t n : {1, 7, 8, 9, 63, 64, 65}) {
        for (bool sym : {false, true}) {
          const Int4Matrix m = RandomMatrix(rng, n, k, ge, sym);
          Packed p(m);
          ASSERT_TRUE(W4Int8Supported(p.w)) << "g=" << ge;
          // M = 1, 2, 5, 19 in turn (the VNNI kernel tiles activation rows by 4, and from 6 rows
          // on puts 16 weight rows in the lanes when g is a multiple of 128).
          const int64_t m_rows = std::array<int64_t, 4>{1, 2, 5, 19}[static_cast<size_t>(cases % 4)];
          std::vector<std::vector<float>> xs_rows;
          const int64_t parts = W4Int8Parts(ge);
          const size_t ab = W4Int8ActsBytes(k, parts);
          std::vector<uint8_t> scratch(ab * static_cast<size_t>(m_rows));
          std::vector<W4Int8Acts> acts;
          for (int64_t i = 0; i < m_rows; ++i) {
            std::vector<float> x(static_cast<size_t>(k));
            for (auto& v : x) v = xd(rng);
            x[static_cast<size_t>((k / 2 + 17 * i) % k)] = 40.f;  // an outlier channel
            if (k >= 256)
              for (int64_t j = 128; j < 256; ++j) x[static_cast<size_t>(j)] = 0.f;  // an all-zero block
            acts.push_back(QuantizeActsInt8(x.data(), k, parts, scratch.data() + ab * static_cast<size_t>(i)));
            xs_rows.push_back(std::move(x));
          }
          std::vector<float> bias(static_cast<size_t>(n));
          for (auto& v : bias) v = xd(rng);
          const float* b = (n % 2 == 1) ? bias.data() : nullptr;
          std::vector<float> ys(static_cast<size_t>(m_rows * n)), yf(ys.size());
          scalar->gemm_i8(p.w, acts.data(), m_rows, b, ys.data(), 0, n);
          for (int64_t i = 0; i < m_rows; ++i) {
            const W4A8Ref ref = W4A8Oracle(m, xs_rows[static_cast<size_t>(i)], b);
            double worst = 0;
            int64_t wn = 0;
            for (int64_t j = 0; j < n; ++j) {
              const double r = std::fabs(ys[i * n + j] - ref.y[j]) / ref.tol[j];
              if (!(r <= worst)) worst = r, wn = j;
            }
            EXPECT_LE(worst, 1.0) << "g=" << ge << " k=" << k << " n=" << n << " sym=" << sym << ": y[" << i << "][" << wn
                                  << "] = " << ys[i * n + wn] << ", oracle " << ref.y[wn] << ", tolerance " << ref.tol[wn];
          }
          for (const W4Kernels* fast : fasts) {
            fast->gemm_i8(p.w, acts.data(), m_rows, b, yf.data(), 0, n);
            EXPECT_EQ(std::memcmp(ys.data(), yf.data(), ys.size() * 4), 0)
                << fast->gemm_i8_name << " g=" << ge << " k=" << k << " n=" << n << " m=" << m_rows << " sym=" << sym;
            // Row tiling does not change a row's result: row 0 alone equals row 0 of the batch.
            std::vector<float> y1(static_cast<size_t>(n));
            fast->gemm_i8(p.w, acts.data(), 1, b, y1.data(), 0, n);
            EXPECT_EQ(std::memcmp(y1.data(), yf.data(), y1.size() * 4), 0) << "m=1 vs m=" << m_rows;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 3 * 7 * 2);
}

// Many activation rows: the VNNI lanes kernel takes them in blocks of at most 128 (its per-worker
// accumulators stay bounded), the AVX2 tiles in chunks of 32; every row is still bit-identical to
// the scalar kernel's.
TEST(W4A8KernelTest, ManyRowsInBoundedBlocksAreBitIdenticalToScalar) {
  std::mt19937 rng(12);
  std::normal_distribution<float> xd(0.f, 1.f);
  const W4Kernels* scalar = W4KernelsFor(Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    const W4Kernels* fast = W4KernelsFor(isa);
    if (fast == nullptr) continue;
    const int64_t n = 40, k = 384, m_rows = 301;
    const Int4Matrix w = RandomMatrix(rng, n, k, 128, false);
    Packed p(w);
    const size_t ab = W4Int8ActsBytes(k, 1);
    std::vector<uint8_t> scratch(ab * static_cast<size_t>(m_rows));
    std::vector<W4Int8Acts> acts;
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t i = 0; i < m_rows; ++i) {
      for (auto& v : x) v = xd(rng);
      acts.push_back(QuantizeActsInt8(x.data(), k, 1, scratch.data() + ab * static_cast<size_t>(i)));
    }
    std::vector<float> bias(static_cast<size_t>(n));
    for (auto& v : bias) v = xd(rng);
    std::vector<float> ys(static_cast<size_t>(m_rows * n)), yf(ys.size());
    scalar->gemm_i8(p.w, acts.data(), m_rows, bias.data(), ys.data(), 0, n);
    fast->gemm_i8(p.w, acts.data(), m_rows, bias.data(), yf.data(), 0, n);
    EXPECT_EQ(std::memcmp(ys.data(), yf.data(), ys.size() * 4), 0) << fast->gemm_i8_name;
  }
}

// The AVX2 kernel forms each lane's sum through int16 pairs (vpmaddubsw, saturating): at the
// extremes (every code 15, every activation code ±127, the signs of a pair equal or mixed) its
// sums and results are still the scalar kernel's, at every group size and for 1 and 3 rows.
TEST(W4A8KernelTest, Avx2AtTheInt16ExtremesIsBitIdenticalToScalar) {
  const W4Kernels* scalar = W4KernelsFor(Isa::kScalar);
  const W4Kernels* avx2 = W4KernelsFor(Isa::kAvx2);
  ASSERT_NE(scalar, nullptr);
  if (avx2 == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  ASSERT_STREQ(avx2->gemm_i8_name, "avx2");
  std::mt19937 rng(47);
  const int64_t n = 5, k = 512;
  for (int64_t g : {32, 64, 128, 256}) {
    Int4Matrix w = RandomMatrix(rng, n, k, g, false);
    std::fill(w.codes.begin(), w.codes.end(), uint8_t{15});
    for (size_t i = 0; i < w.zero_points.size(); ++i) w.zero_points[i] = i % 2 == 0 ? 0 : 15;
    Packed p(w);
    const int64_t parts = W4Int8Parts(g), m_rows = 3;
    const size_t ab = W4Int8ActsBytes(k, parts);
    std::vector<uint8_t> scratch(ab * m_rows);
    std::vector<W4Int8Acts> acts;
    for (int64_t i = 0; i < m_rows; ++i) {
      std::vector<float> x(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j)  // all +1, all −1, or sign flipping every 64 values
        x[static_cast<size_t>(j)] = i == 0 ? 1.f : i == 1 ? -1.f : ((j / 64) % 2 == 0 ? 1.f : -1.f);
      acts.push_back(QuantizeActsInt8(x.data(), k, parts, scratch.data() + ab * static_cast<size_t>(i)));
    }
    for (int64_t rows : {int64_t{1}, m_rows}) {
      std::vector<float> ys(static_cast<size_t>(rows * n)), yf(ys.size());
      scalar->gemm_i8(p.w, acts.data(), rows, nullptr, ys.data(), 0, n);
      avx2->gemm_i8(p.w, acts.data(), rows, nullptr, yf.data(), 0, n);
      EXPECT_EQ(std::memcmp(ys.data(), yf.data(), ys.size() * 4), 0) << "g=" << g << " rows=" << rows;
    }
  }
}

// Long rows (K from W4DecodeChunkMinK of this CPU's L1): the VNNI decode loop reads eight weight
// rows at a time in chunks; still bit-identical to the scalar kernel (tail rows, a partial chunk).
TEST(W4A8KernelTest, LongRowsInChunksAreBitIdenticalToScalar) {
  std::mt19937 rng(46);
  std::normal_distribution<float> xd(0.f, 1.f);
  const W4Kernels* scalar = W4KernelsFor(Isa::kScalar);
  const W4Kernels* fast = W4KernelsFor(Isa::kAvx512);
  ASSERT_NE(scalar, nullptr);
  if (fast == nullptr) GTEST_SKIP() << "no AVX-512 on this CPU";
  const int64_t n = 19, k = W4DecodeChunkMinK(L1DataCacheBytes(), kW4I8ActBytesPerGroup) + 5 * 128;
  for (bool sym : {false, true}) {
    const Int4Matrix w = RandomMatrix(rng, n, k, 128, sym);
    Packed p(w);
    std::vector<uint8_t> scratch(W4Int8ActsBytes(k, 1));
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = xd(rng);
    const W4Int8Acts acts = QuantizeActsInt8(x.data(), k, 1, scratch.data());
    std::vector<float> bias(static_cast<size_t>(n));
    for (auto& v : bias) v = xd(rng);
    std::vector<float> ys(static_cast<size_t>(n)), yf(ys.size());
    scalar->gemm_i8(p.w, &acts, 1, bias.data(), ys.data(), 0, n);
    fast->gemm_i8(p.w, &acts, 1, bias.data(), yf.data(), 0, n);
    EXPECT_EQ(std::memcmp(ys.data(), yf.data(), ys.size() * 4), 0) << fast->gemm_i8_name << " k=" << k << " sym=" << sym;
  }
}

TEST(W4A8KernelTest, ActivationCodesRoundHalfToEvenIntoTheSuperblockOrder) {
  // amax = 127 makes the code of x exactly round-half-even(x): ties go to the even neighbour.
  std::vector<float> x(200, 0.f);
  const std::vector<std::pair<float, int>> cases = {{2.5f, 2},     {3.5f, 4},   {-2.5f, -2}, {-3.5f, -4}, {0.5f, 0},
                                                    {-0.5f, 0},    {126.5f, 126}, {1.49f, 1}, {-1.51f, -2}, {127.f, 127},
                                                    {-127.f, -127}, {0.f, 0}};
  for (size_t i = 0; i < cases.size(); ++i) x[3 * i + 1] = cases[i].first;
  x[150] = 63.5f;  // second block: amax 63.5, so 63.5 -> 127 and 31.75 -> 63.5 -> 64 (tie to even)
  x[151] = 31.75f;
  x[152] = -0.25f;  // -0.5 -> 0
  std::vector<uint8_t> scratch(W4Int8ActsBytes(200, 1));
  const W4Int8Acts a = QuantizeActsInt8(x.data(), 200, 1, scratch.data());
  ASSERT_EQ(a.blocks, 2);
  // Code of value o of block t: byte (o % 32 / 16 ? B : A)[4 * (o % 16) + o / 32].
  auto code = [&](int64_t k) {
    const int64_t t = k / 128, o = k % 128;
    const int8_t* half = a.x8 + t * 128 + ((o % 32) / 16) * 64;
    return static_cast<int>(half[4 * (o % 16) + o / 32]);
  };
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(code(static_cast<int64_t>(3 * i + 1)), cases[i].second) << cases[i].first;
  EXPECT_EQ(a.xs[0], 1.f);
  EXPECT_EQ(code(150), 127);
  EXPECT_EQ(code(151), 64);
  EXPECT_EQ(code(152), 0);
  EXPECT_EQ(code(199), 0);  // padding past K
  int32_t s0 = 0;
  for (const auto& c : cases) s0 += c.second;
  EXPECT_EQ(a.sx[0], s0);
  EXPECT_EQ(a.sx[1], 127 + 64);
}

TEST(W4A8KernelTest, ThreadsAndInt4LinearAndUnsupportedGroupSizes) {
  std::mt19937 rng(12);
  std::normal_distribution<float> xd(0.f, 1.f);
  const Int4Matrix w = RandomMatrix(rng, 1000, 512, 128, false);
  Packed p(w);
  constexpr int kRows = 12;  // from 6 rows on the VNNI kernel puts weight rows in the lanes
  std::vector<float> x(512 * kRows);
  for (auto& v : x) v = xd(rng);
  std::vector<uint8_t> scratch(W4Int8ActsBytes(512, 1) * kRows);
  std::vector<W4Int8Acts> a;
  for (int i = 0; i < kRows; ++i)
    a.push_back(QuantizeActsInt8(x.data() + 512 * i, 512, 1, scratch.data() + W4Int8ActsBytes(512, 1) * i));
  const int saved = omp_get_max_threads();
  for (int m : {3, kRows}) {
    std::vector<float> y1(static_cast<size_t>(1000 * m)), y2(y1.size());
    omp_set_num_threads(1);
    GemmW4A8Packed(p.w, a.data(), m, nullptr, y1.data());
    omp_set_num_threads(2);
    GemmW4A8Packed(p.w, a.data(), m, nullptr, y2.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << "m=" << m;
  }
  omp_set_num_threads(saved);

  // Int4Linear: the opt-in switches every M (also M >= kDequantGemmMinRows) to the W4A8 GEMM.
  Int4Linear lin(w, {}, "test");
  ASSERT_TRUE(lin.SetInt8Activations(true));
  for (int64_t m : {int64_t{3}, Int4Linear::kDequantGemmMinRows + 1}) {
    std::vector<float> xm(static_cast<size_t>(m * 512)), y(static_cast<size_t>(m * 1000));
    for (auto& v : xm) v = xd(rng);
    lin.Forward(xm.data(), m, y.data());
    for (int64_t i = 0; i < m; i += m - 1) {
      const W4Int8Acts ai = QuantizeActsInt8(xm.data() + i * 512, 512, 1, scratch.data());
      std::vector<float> yr(1000);
      GemmW4A8PackedScalar(p.w, &ai, 1, nullptr, yr.data(), 0, 1000);
      EXPECT_EQ(std::memcmp(yr.data(), y.data() + i * 1000, 4000), 0) << "m=" << m << " row " << i;
    }
  }
  // Back to W4A32: the fp32 kernels' result again.
  EXPECT_FALSE(lin.SetInt8Activations(false));
  std::vector<float> y32(1000), yl(1000);
  GemmW4A32Packed({1, &p.w, x.data(), nullptr, y32.data()});
  lin.Forward(x.data(), 1, yl.data());
  EXPECT_EQ(std::memcmp(y32.data(), yl.data(), 4000), 0);

  // Group sizes the int8 kernels do not serve stay W4A32.
  for (int64_t g : {16, 48, 192}) {
    const Int4Matrix wg = RandomMatrix(rng, 8, 384, g, true);
    Int4Linear lg(wg, {}, "g");
    EXPECT_FALSE(lg.SetInt8Activations(true)) << "g=" << g;
  }
}

}  // namespace
}  // namespace nibble
