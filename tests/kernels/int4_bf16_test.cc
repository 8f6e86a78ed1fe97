// The opt-in bf16-activation path (kernels/int4_packed.h W4Bf16Acts, docs/KERNELS.md "bf16
// activations"): the arrangement of the prepared activations, the AVX-512 BF16 kernel against an
// independent oracle (bf16-rounded x, dequantized W, products summed in double) on shapes with
// tails, bit-identity across activation-row tilings and thread counts, the prefill path's bf16
// weights (bit-exact) and bf16 matmul (against a double sum), and Int4Linear with the switch on
// (fast kernel, matmul or fallback) for decode and prefill row counts.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/half.h"
#include "base/page_buffer.h"
#include "formats/int4_matrix.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_dispatch.h"
#include "kernels/int4_gemm.h"
#include "kernels/int4_packed.h"
#include "kernels/int4_ref.h"
#include "kernels/x86_avx512bf16/int4_gemm_bf16.h"
#include "model/int4_linear.h"
#include "test_util.h"

namespace nibble {
namespace {

struct Packed {
  std::vector<uint8_t> bytes;
  W4PackedWeight w;
  explicit Packed(const Int4Matrix& m)
      : bytes(static_cast<size_t>(W4PackedBytes(m.n, m.k, m.group_size, m.symmetric))),
        w(PackW4(m.n, m.k, m.group_size, m.symmetric, m.codes.data(), m.scales.data(), m.zero_points.data(),
                 bytes.data())) {}
};

// m rows of x [m, k] prepared for the bf16 kernels (PrepareActsBf16), each in its part of one scratch.
struct PreparedRows {
  PageBuffer scratch;
  std::vector<W4Bf16Acts> acts;
  PreparedRows(const float* x, int64_t m, int64_t k, int64_t g) : scratch(W4Bf16ActsBytes(k, g) * static_cast<size_t>(m)) {
    const size_t ab = W4Bf16ActsBytes(k, g);
    for (int64_t i = 0; i < m; ++i) acts.push_back(PrepareActsBf16(x + i * k, k, g, scratch.data() + ab * static_cast<size_t>(i)));
  }
};

// A random weight (n x k, group g), its packed form, `m_rows` Gaussian activation rows prepared
// for the kernel and a Gaussian bias (passed only with symmetric weights), drawn in that order.
struct BatchCase {
  Int4Matrix m;
  Packed p;
  std::vector<float> x;
  PreparedRows rows;
  std::vector<float> bias;
  BatchCase(std::mt19937& rng, std::normal_distribution<float>& xd, int64_t n, int64_t k, int64_t g, bool sym,
            int64_t m_rows)
      : m(nibble_test::RandomInt4Matrix(rng, n, k, g, sym)), p(m), x(Draw(rng, xd, k * m_rows)),
        rows(x.data(), m_rows, k, g), bias(Draw(rng, xd, n)) {}
  const float* b() const { return m.symmetric ? bias.data() : nullptr; }

  static std::vector<float> Draw(std::mt19937& rng, std::normal_distribution<float>& xd, int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (auto& e : v) e = xd(rng);
    return v;
  }
};

// Independent oracle: y = Σ_k bf16(x_k) · (q − z)·s (+ b) in double, and a tolerance: the kernel
// multiplies bf16(x) by the codes as 128 + q (exact products) and adds the correction −(128 + z)·σ,
// each partial sum rounded in fp32 along chains no longer than K/16 + 16, so
// |y − oracle| <= γ_{K/16+16} · (Σ_k s_k |x̂_k| (128 + q_k + 2·(128 + z_k)) + |b|).
struct Ref {
  std::vector<double> y, tol;
};

// The AMX kernel's chains are longer: per group g/2 products per chain, then four more steps, and
// one step per group in the running sum.
int64_t AmxChain(int64_t k, int64_t g) { return g / 2 + k / g + 4; }

Ref Oracle(const Int4Matrix& m, const float* x, const float* bias, int64_t chain = 0) {
  std::vector<float> wd(static_cast<size_t>(m.n * m.k));
  DequantizeRef(m, wd.data());
  const double gamma = nibble_test::Fp32Gamma(std::max(chain, m.k / 16 + 16));
  Ref r;
  for (int64_t n = 0; n < m.n; ++n) {
    double acc = 0, mag = 0;
    for (int64_t k = 0; k < m.k; ++k) {
      const double xb = Bf16ToF32(F32ToBf16(x[k]));
      acc += static_cast<double>(wd[n * m.k + k]) * xb;
      const size_t gi = static_cast<size_t>(n * m.groups() + k / m.group_size);
      mag += static_cast<double>(m.scales[gi]) * std::fabs(xb) *
             (128.0 + m.codes[static_cast<size_t>(n * m.k + k)] + 2.0 * (128.0 + m.zero_points[gi]));
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

// The fast kernel, or nullptr (the CPU lacks avx512_bf16 / avx512_vbmi: those tests skip).
W4GemmBf16Kernel FastKernel() {
  const W4Kernels* k = W4KernelsFor(Isa::kAvx512);
  return k != nullptr ? k->gemm_bf16 : nullptr;
}

TEST(W4Bf16Test, PreparedActivationsAreRoundedAndInSuperblockOrder) {
  const int64_t k = 96, g = 32;
  std::vector<float> x(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(i)] = 1.f + static_cast<float>(i) / 64.f;
  // Ties to even: 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7 -> 1;
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6 (even mantissa).
  x[5] = 1.f + std::ldexp(1.f, -8);
  x[6] = 1.f + 3.f * std::ldexp(1.f, -8);
  std::vector<uint8_t> scratch(W4Bf16ActsBytes(k, g));
  const W4Bf16Acts a = PrepareActsBf16(x.data(), k, g, scratch.data());
  ASSERT_EQ(a.runs, 3);
  auto value = [&](int64_t u, int64_t word) { return Bf16ToF32(a.xb[32 * u + word]); };
  EXPECT_EQ(value(0, 2 * 5), 1.f);
  EXPECT_EQ(value(0, 2 * 6), 1.f + std::ldexp(1.f, -6));
  for (int64_t u = 0; u < 3; ++u)
    for (int64_t l = 0; l < 16; ++l) {
      if (u == 0 && (l == 5 || l == 6)) continue;
      EXPECT_EQ(value(u, 2 * l), Bf16ToF32(F32ToBf16(x[static_cast<size_t>(32 * u + l)]))) << u << " " << l;
      EXPECT_EQ(value(u, 2 * l + 1), Bf16ToF32(F32ToBf16(x[static_cast<size_t>(32 * u + 16 + l)]))) << u << " " << l;
    }
  for (int64_t gi = 0; gi < 3; ++gi) {
    float sigma = 0.f;
    for (int64_t i = 32 * gi; i < 32 * gi + 32; ++i) sigma += Bf16ToF32(F32ToBf16(x[static_cast<size_t>(i)]));
    EXPECT_EQ(a.c0[gi], -8.f * sigma);
    EXPECT_EQ(a.c1[gi], -sigma / 16.f);
  }
  // xf: the same values as fp32 in K order, the FMA blocks' operands.
  for (int64_t i = 0; i < k; ++i) {
    const int64_t u = i / 32, l = i % 32, word = l < 16 ? 2 * l : 2 * (l - 16) + 1;
    EXPECT_EQ(a.xf[i], value(u, word)) << i;
  }
  // A subnormal bf16 reaches them as zero of its sign, as vdpbf16ps reads it.
  x[7] = 3e-39f;
  x[8] = -3e-39f;
  const W4Bf16Acts s = PrepareActsBf16(x.data(), k, g, scratch.data());
  EXPECT_NE(s.xb[2 * 7], 0);
  EXPECT_EQ(s.xf[7], 0.f);
  EXPECT_TRUE(std::signbit(s.xf[8]) && s.xf[8] == 0.f);
  float sigma0 = 0.f;  // σ keeps them (its sums are not vdpbf16ps)
  for (int64_t i = 0; i < 32; ++i) sigma0 += Bf16ToF32(F32ToBf16(x[static_cast<size_t>(i)]));
  EXPECT_EQ(s.c0[0], -8.f * sigma0);
  // zc: each group's chain start for every zero point, the bits of fma(z, c1, c0) (what the row
  // loops computed per group before), also where σ is tiny enough for c1 to be subnormal.
  for (const float scale : {1.f, 3e-37f, 1e-40f, -7e3f}) {
    for (int64_t i = 0; i < k; ++i)  // exponents spread over 2^-22..1: σ has a full 24-bit mantissa
      x[static_cast<size_t>(i)] = scale * (i % 3 == 0 ? -1.f : 1.f) *
                                  std::ldexp(1.f + static_cast<float>((37 * i) % 127) / 128.f, -static_cast<int>(i % 23));
    const W4Bf16Acts t = PrepareActsBf16(x.data(), k, g, scratch.data());
    for (int64_t gi = 0; gi < k / g; ++gi)
      for (int z = 0; z < 16; ++z) {
        const float want = std::fma(static_cast<float>(z), t.c1[gi], t.c0[gi]);
        EXPECT_EQ(std::memcmp(&t.zc[16 * gi + z], &want, 4), 0) << scale << " " << gi << " " << z << ": " << t.zc[16 * gi + z];
      }
  }
  std::vector<float> r(static_cast<size_t>(k));
  x[5] = 1.f + std::ldexp(1.f, -8);
  x[6] = 1.f + 3.f * std::ldexp(1.f, -8);
  RoundToBf16(x.data(), k, r.data());
  EXPECT_EQ(r[5], 1.f);
  EXPECT_EQ(r[6], 1.f + std::ldexp(1.f, -6));
}

// xs, the decode loop's second pairing at g = 128: in superblock s, word 32c + 2l holds position
// 128s + 16c + l and word 32c + 2l + 1 position 128s + 64 + 16c + l, the same bits as xb; none at
// other group sizes.
TEST(W4Bf16Test, ShiftPairingHoldsTheSameWordsAsTheSuperblockOrder) {
  const int64_t k = 384;
  std::vector<float> x(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    x[static_cast<size_t>(i)] = std::ldexp(1.f + static_cast<float>(i % 97) / 97.f, static_cast<int>(i % 9) - 4);
  std::vector<uint8_t> scratch(W4Bf16ActsBytes(k, 128));
  const W4Bf16Acts a = PrepareActsBf16(x.data(), k, 128, scratch.data());
  ASSERT_NE(a.xs, nullptr);
  for (int64_t s = 0; s < k / 128; ++s)
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t l = 0; l < 16; ++l)
        for (int64_t hi = 0; hi < 2; ++hi) {
          const int64_t pos = 128 * s + 64 * hi + 16 * c + l;
          EXPECT_EQ(a.xs[128 * s + 32 * c + 2 * l + hi], F32ToBf16(x[static_cast<size_t>(pos)])) << s << " " << c << " " << l;
        }
  std::vector<uint8_t> other(W4Bf16ActsBytes(k, 64));
  EXPECT_EQ(PrepareActsBf16(x.data(), k, 64, other.data()).xs, nullptr);
}

// Both decode-loop unpacks (W4Bf16Unpack: multishift, and shifts on another activation pairing)
// with the rest of the kernel; the dispatch picks one by CPU.
TEST(W4Bf16Test, KernelMatchesTheOracleOnTailShapesAndTilings) {
  if (FastKernel() == nullptr) GTEST_SKIP() << "no AVX-512 BF16 kernel on this CPU: " << ActiveW4Dispatch().gemm_bf16_reason;
  std::mt19937 rng(21);
  std::normal_distribution<float> xd(0.f, 1.f);
  int cases = 0;
  constexpr auto kNta = StreamPrefetch::kNonTemporal;
  const W4GemmBf16Kernel variants[] = {GemmW4Bf16Avx512<kNta>,
                                       GemmW4Bf16Avx512<kNta, W4Bf16BlockArith::kDpbf16, W4Bf16Unpack::kShift>};
  for (const W4GemmBf16Kernel fast : variants) {
    SCOPED_TRACE(fast == variants[0] ? "vpmultishiftqb unpack" : "shift unpack");
    for (int64_t g : {32, 64, 96, 128, 256, -1}) {
      for (int64_t kmul : {1, 3, 0}) {
        // kmul 0: K = 8576 / g · g (67 groups at g128: the blocks' zero-point corrections in chunks of
        // 64 groups, then a partial chunk of 3).
        const int64_t k = g == -1 ? (kmul == 0 ? 4096 : 160 * kmul) : (kmul == 0 ? 8576 / g * g : g * kmul);
        const int64_t ge = g == -1 ? k : g;
        for (int64_t n : {1, 7, 8, 9, 63, 64, 65}) {
          for (bool sym : {false, true}) {
            const Int4Matrix m = nibble_test::RandomInt4Matrix(rng, n, k, ge, sym);
            Packed p(m);
            ASSERT_TRUE(W4Bf16Supported(p.w));
            // M = 1 (each case twice: sym off and on) runs the row tile or the decode loop; M = 2,
            // 5, 9 with g % 128 == 0 the blocks of 2 weight rows × up to 4 activation rows (from
            // kW4Bf16BlockMinRows rows on), with tails; else row tiles.
            const int64_t m_rows = std::array<int64_t, 4>{1, 2, 5, 9}[static_cast<size_t>((cases / 2) % 4)];
            const bool blocks = m_rows >= kW4Bf16BlockMinRows && ge % 128 == 0;
            std::vector<float> x(static_cast<size_t>(k * m_rows));
            for (auto& v : x) v = xd(rng);
            x[static_cast<size_t>(k / 2)] = 300.f;  // an outlier channel
            PreparedRows rows(x.data(), m_rows, k, ge);
            const std::vector<W4Bf16Acts>& acts = rows.acts;
            std::vector<float> bias(static_cast<size_t>(n));
            for (auto& v : bias) v = xd(rng);
            const float* b = (n % 2 == 1) ? bias.data() : nullptr;
            std::vector<float> y(static_cast<size_t>(m_rows * n));
            fast(p.w, acts.data(), m_rows, b, y.data(), 0, n);
            for (int64_t i = 0; i < m_rows; ++i) {
              const Ref ref = Oracle(m, x.data() + i * k, b);
              double worst = 0;
              int64_t wn = 0;
              for (int64_t j = 0; j < n; ++j) {
                const double r = std::fabs(y[i * n + j] - ref.y[j]) / ref.tol[j];
                if (!(r <= worst)) worst = r, wn = j;
              }
              EXPECT_LE(worst, 1.0) << "g=" << ge << " k=" << k << " n=" << n << " sym=" << sym << ": y[" << i << "][" << wn
                                    << "] = " << y[i * n + wn] << ", oracle " << ref.y[wn] << ", tolerance " << ref.tol[wn];
            }
            // Row tiling does not change a row's result: each row alone (row tiles) or the batch
            // without its first row (blocks, rows in other slots), and a sub-range of N.
            if (!blocks) {
              for (int64_t i = 0; i < m_rows; ++i) {
                std::vector<float> y1(static_cast<size_t>(n));
                fast(p.w, acts.data() + i, 1, b, y1.data(), 0, n);
                EXPECT_EQ(std::memcmp(y1.data(), y.data() + i * n, y1.size() * 4), 0) << "row " << i << " of " << m_rows;
              }
            } else if (m_rows - 1 >= kW4Bf16BlockMinRows) {
              std::vector<float> y1(static_cast<size_t>((m_rows - 1) * n));
              fast(p.w, acts.data() + 1, m_rows - 1, b, y1.data(), 0, n);
              EXPECT_EQ(std::memcmp(y1.data(), y.data() + n, y1.size() * 4), 0) << "blocks, rows 1.. of " << m_rows;
            }
            if (n > 2) {
              std::vector<float> yr(y.size(), -1.f);
              fast(p.w, acts.data(), m_rows, b, yr.data(), 1, n - 1);
              for (int64_t i = 0; i < m_rows; ++i)
                EXPECT_EQ(std::memcmp(yr.data() + i * n + 1, y.data() + i * n + 1, static_cast<size_t>(n - 2) * 4), 0);
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 6 * 3 * 7 * 2);
}

// Long rows (K from W4DecodeChunkMinK of this CPU's L1): the decode loop reads eight weight
// rows at a time in chunks of groups; each row keeps the bits it has alone (a call for one row
// takes the one-row loop), with tail rows, a partial last chunk, and both unpacks.
TEST(W4Bf16Test, LongRowsInChunksKeepEachRowsBits) {
  EXPECT_EQ(W4DecodeChunkMinK(32 * 1024, kW4Bf16ActBytesPerGroup), 9856);  // 2.5·K > 24 KiB
  EXPECT_EQ(W4DecodeChunkMinK(48 * 1024, kW4Bf16ActBytesPerGroup), 14848);
  EXPECT_EQ(W4DecodeChunkMinK(32 * 1024, kW4I8ActBytesPerGroup), 23168);
  if (FastKernel() == nullptr) GTEST_SKIP() << "no AVX-512 BF16 kernel on this CPU: " << ActiveW4Dispatch().gemm_bf16_reason;
  std::mt19937 rng(46);
  std::normal_distribution<float> xd(0.f, 1.f);
  constexpr auto kNta = StreamPrefetch::kNonTemporal;
  const W4GemmBf16Kernel variants[] = {GemmW4Bf16Avx512<kNta>,
                                       GemmW4Bf16Avx512<kNta, W4Bf16BlockArith::kDpbf16, W4Bf16Unpack::kShift>};
  const int64_t k = W4DecodeChunkMinK(L1DataCacheBytes(), kW4Bf16ActBytesPerGroup) + 5 * 128, n = 19;
  for (bool sym : {false, true}) {
    const Int4Matrix m = nibble_test::RandomInt4Matrix(rng, n, k, 128, sym);
    Packed p(m);
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = xd(rng);
    PreparedRows rows(x.data(), 1, k, 128);
    std::vector<float> bias(static_cast<size_t>(n));
    for (auto& v : bias) v = xd(rng);
    const Ref ref = Oracle(m, x.data(), bias.data());
    for (const W4GemmBf16Kernel fast : variants) {
      SCOPED_TRACE(std::string(fast == variants[0] ? "vpmultishiftqb" : "shift") + (sym ? " sym" : " asym"));
      std::vector<float> y(static_cast<size_t>(n));
      fast(p.w, rows.acts.data(), 1, bias.data(), y.data(), 0, n);
      std::vector<float> alone(static_cast<size_t>(n), -1.f);
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_LE(std::fabs(y[j] - ref.y[j]), ref.tol[j]) << "row " << j << " k=" << k;
        fast(p.w, rows.acts.data(), 1, bias.data(), alone.data(), j, j + 1);
        EXPECT_EQ(std::memcmp(&alone[j], &y[j], 4), 0) << "row " << j << ": " << alone[j] << " alone, " << y[j] << " in chunks";
      }
    }
  }
}

// The batch a tile kernel reads: run u's pair l of activation row i at [u][l][i], zeros past M;
// 16·c0 and 16·c1 per group and row (scalar code: runs on every CPU).
TEST(W4Bf16Test, BatchArrangesPairsAndCorrectionsForTiles) {
  const int64_t k = 384, g = 128, m = 3;
  std::mt19937 rng(25);
  std::normal_distribution<float> xd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(k * m));
  for (auto& v : x) v = xd(rng);
  PreparedRows rows(x.data(), m, k, g);
  const std::vector<W4Bf16Acts>& a = rows.acts;
  PageBuffer bs(W4Bf16BatchBytes(k, g));
  std::memset(bs.data(), 0xAB, bs.size());  // every byte the batch uses must be written
  const W4Bf16Batch b = PrepareBf16Batch(a.data(), m, bs.data());
  ASSERT_EQ(b.m, m);
  ASSERT_EQ(b.runs, k / 32);
  for (int64_t u = 0; u < b.runs; ++u)
    for (int64_t l = 0; l < 16; ++l)
      for (int64_t i = 0; i < 16; ++i) {
        uint32_t want = 0;
        if (i < m) std::memcpy(&want, a[static_cast<size_t>(i)].xb + 32 * u + 2 * l, 4);
        ASSERT_EQ(b.pairs[256 * u + 16 * l + i], want) << "u=" << u << " l=" << l << " i=" << i;
      }
  for (int64_t gi = 0; gi < k / g; ++gi)
    for (int64_t i = 0; i < 16; ++i) {
      EXPECT_EQ(b.c0[16 * gi + i], i < m ? 16.f * a[static_cast<size_t>(i)].c0[gi] : 0.f);
      EXPECT_EQ(b.c1[16 * gi + i], i < m ? 16.f * a[static_cast<size_t>(i)].c1[gi] : 0.f);
    }
}

// A stand-in for the AMX kernel that reads the batch as W4Bf16Batch documents it and sums in double:
// lets the driver's batching be checked on every CPU. Records the batch sizes it was given.
std::vector<int64_t> fake_batches;
int fake_row_calls = 0;
void FakeBatchKernel(const W4PackedWeight& w, const W4Bf16Batch& b, const float* bias, float* y, int64_t n0,
                     int64_t n1) {
  if (n0 == 0) fake_batches.push_back(b.m);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.data + n * w.row_bytes;
    for (int64_t i = 0; i < b.m; ++i) {
      double acc = bias != nullptr ? bias[n] : 0.0;
      for (int64_t gi = 0; gi < w.k / w.group_size; ++gi) {
        const uint8_t* rec = row + gi * w.rec_bytes;
        double dot = 0;
        for (int64_t o = 0; o < w.group_size; ++o) {  // weight o of the group: run u, pair l, half h
          const int64_t kk = gi * w.group_size + o, u = kk / 32, l = kk % 16, h = (kk % 32) / 16;
          uint16_t xw[2];
          std::memcpy(xw, b.pairs + 256 * u + 16 * l + i, 4);
          dot += (128.0 + w4p::CodeAt(w, rec, o)) * Bf16ToF32(xw[h]);
        }
        const double z = w4p::Zero(w, rec, 0);
        dot += static_cast<double>(b.c0[16 * gi + i]) + z * b.c1[16 * gi + i];
        acc += w4p::Scale(rec, 0) * dot;
      }
      y[i * w.n + n] = static_cast<float>(acc);
    }
  }
}
void FakeRowKernel(const W4PackedWeight&, const W4Bf16Acts*, int64_t, const float*, float*, int64_t, int64_t) {
  ++fake_row_calls;
}

// GemmW4Bf16Packed hands the AMX kernel the rows 16 at a time from kW4Bf16AmxMinRows rows on (each
// batch arranged as documented, its outputs at its rows), fewer rows to the row kernel.
TEST(W4Bf16Test, AmxDriverTakesTheRowsSixteenAtATime) {
  std::mt19937 rng(27);
  std::normal_distribution<float> xd(0.f, 1.f);
  const int64_t n = 40, k = 256, g = 128, rows = 37;
  const Int4Matrix w = nibble_test::RandomInt4Matrix(rng, n, k, g, false);
  Packed p(w);
  std::vector<float> x(static_cast<size_t>(k * rows)), bias(static_cast<size_t>(n));
  for (auto& v : x) v = xd(rng);
  for (auto& v : bias) v = xd(rng);
  PreparedRows prepared(x.data(), rows, k, g);
  const std::vector<W4Bf16Acts>& a = prepared.acts;
  W4Kernels fake = *W4KernelsFor(Isa::kScalar);
  fake.gemm_bf16 = FakeRowKernel;
  fake.gemm_bf16_amx = FakeBatchKernel;
  fake_batches.clear();
  std::vector<float> y(static_cast<size_t>(rows * n), -1.f);
  GemmW4Bf16Packed(p.w, a.data(), rows, bias.data(), y.data(), &fake);
  EXPECT_EQ(fake_batches, (std::vector<int64_t>{16, 16, 5}));
  EXPECT_EQ(fake_row_calls, 0);
  for (int64_t i = 0; i < rows; ++i) {
    const Ref ref = Oracle(w, x.data() + i * k, bias.data());
    for (int64_t j = 0; j < n; ++j)
      ASSERT_NEAR(y[static_cast<size_t>(i * n + j)], ref.y[static_cast<size_t>(j)], 1e-4 * ref.tol[static_cast<size_t>(j)] / nibble_test::Fp32Gamma(k / 16 + 16))
          << "y[" << i << "][" << j << "]";
  }
  EXPECT_TRUE(W4Bf16AmxServes(p.w, kW4Bf16AmxMinRows, &fake));
  EXPECT_FALSE(W4Bf16AmxServes(p.w, kW4Bf16AmxMinRows - 1, &fake));
  GemmW4Bf16Packed(p.w, a.data(), kW4Bf16AmxMinRows - 1, bias.data(), y.data(), &fake);
  EXPECT_GT(fake_row_calls, 0);
  EXPECT_EQ(fake_batches.size(), 3u);
  const Int4Matrix w64 = nibble_test::RandomInt4Matrix(rng, 8, 256, 64, false);
  Packed p64(w64);
  EXPECT_FALSE(W4Bf16AmxServes(p64.w, 8, &fake)) << "g = 64";
}

// The AMX tile kernel (from kW4Bf16AmxMinRows rows at g % 128 == 0) through GemmW4Bf16Packed
// against the oracle with its chain length, on shapes with row tails; a row's result does not
// depend on the other rows of the batch, on the N range or on the thread count.
TEST(W4Bf16Test, AmxKernelMatchesTheOracleOnTailShapes) {
  const W4Kernels* avx512 = W4KernelsFor(Isa::kAvx512);
  if (avx512 == nullptr || avx512->gemm_bf16_amx == nullptr)
    GTEST_SKIP() << "no AMX tile kernel on this CPU: " << ActiveW4Dispatch().gemm_bf16_reason;
  std::mt19937 rng(26);
  std::normal_distribution<float> xd(0.f, 1.f);
  const int saved = omp_get_max_threads();
  int cases = 0;
  for (int64_t g : {128, 256, -1})
    for (int64_t kmul : {1, 3, 0}) {
      const int64_t k = g == -1 ? 128 * (kmul == 0 ? 32 : 3 * kmul) : (kmul == 0 ? 8576 / g * g : g * kmul);
      const int64_t ge = g == -1 ? k : g;
      for (int64_t n : {1, 7, 16, 17, 33, 65})
        for (bool sym : {false, true}) {
          const Int4Matrix w = nibble_test::RandomInt4Matrix(rng, n, k, ge, sym);
          Packed p(w);
          // 21 rows: a batch of 16, then one of 5.
          const int64_t m = std::array<int64_t, 4>{4, 7, 16, 21}[static_cast<size_t>(cases % 4)];
          std::vector<float> x(static_cast<size_t>(k * m));
          for (auto& v : x) v = xd(rng);
          x[static_cast<size_t>(k / 2)] = 300.f;  // an outlier channel
          PreparedRows rows(x.data(), m, k, ge);
          const std::vector<W4Bf16Acts>& acts = rows.acts;
          std::vector<float> bias(static_cast<size_t>(n));
          for (auto& v : bias) v = xd(rng);
          const float* b = (n % 2 == 1) ? bias.data() : nullptr;
          std::vector<float> y(static_cast<size_t>(m * n)), y2(y.size());
          omp_set_num_threads(1);
          GemmW4Bf16Packed(p.w, acts.data(), m, b, y.data(), avx512);
          omp_set_num_threads(2);
          GemmW4Bf16Packed(p.w, acts.data(), m, b, y2.data(), avx512);
          EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * 4), 0) << "threads, g=" << ge << " k=" << k << " n=" << n;
          for (int64_t i = 0; i < m; ++i) {
            const Ref ref = Oracle(w, x.data() + i * k, b, AmxChain(k, ge));
            for (int64_t j = 0; j < n; ++j)
              ASSERT_LE(std::fabs(y[static_cast<size_t>(i * n + j)] - ref.y[static_cast<size_t>(j)]), ref.tol[static_cast<size_t>(j)])
                  << "g=" << ge << " k=" << k << " n=" << n << " sym=" << sym << " m=" << m << ": y[" << i << "][" << j << "]";
          }
          // The batch without its first row, and one weight row range inside the first 16.
          if (m - 1 >= kW4Bf16AmxMinRows) {
            std::vector<float> y1(static_cast<size_t>((m - 1) * n));
            GemmW4Bf16Packed(p.w, acts.data() + 1, m - 1, b, y1.data(), avx512);
            EXPECT_EQ(std::memcmp(y1.data(), y.data() + n, y1.size() * 4), 0) << "rows 1.. of " << m;
          }
          if (n > 2) {
            PageBuffer bs(W4Bf16BatchBytes(k, ge));
            const int64_t mb = std::min(m, kW4Bf16BatchMaxRows);
            const W4Bf16Batch batch = PrepareBf16Batch(acts.data(), mb, bs.data());
            std::vector<float> yr(y.size(), -1.f);
            const int64_t n1 = std::min<int64_t>(n - 1, 16);
            avx512->gemm_bf16_amx(p.w, batch, b, yr.data(), 1, n1);
            for (int64_t i = 0; i < mb; ++i)
              EXPECT_EQ(std::memcmp(yr.data() + i * n + 1, y.data() + i * n + 1, static_cast<size_t>(n1 - 1) * 4), 0)
                  << "rows 1.." << n1 << " of n=" << n;
          }
          ++cases;
        }
    }
  omp_set_num_threads(saved);
  EXPECT_EQ(cases, 3 * 3 * 6 * 2);
}

// The prefill path's weights: bf16 bit patterns of the exact dequantized values, on every ISA.
TEST(W4Bf16Test, DequantToBf16IsTheRoundedExactDequant) {
  std::mt19937 rng(23);
  int checked = 0;
  for (int64_t g : {32, 128, -1})
    for (int64_t n : {1, 7, 65, 130})
      for (bool sym : {false, true}) {
        const int64_t k = g == -1 ? 160 : g * 3;
        const Int4Matrix m = nibble_test::RandomInt4Matrix(rng, n, k, g == -1 ? k : g, sym);
        Packed p(m);
        std::vector<float> ref(static_cast<size_t>(n * k));
        DequantizeRef(m, ref.data());
        for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
          const W4Kernels* kern = W4KernelsFor(isa);
          if (kern == nullptr) continue;
          std::vector<uint16_t> out(ref.size(), 0xFFFF);
          DequantW4PackedBf16(p.w, out.data(), kern);
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_EQ(out[i], F32ToBf16(ref[i])) << IsaName(isa) << " g=" << g << " n=" << n << " i=" << i;
          ++checked;
        }
      }
  EXPECT_GE(checked, 24);
}

// Independent oracle for the bf16 matmul: products of bf16 values are exact in fp32, so any fp32
// summation order of K terms is within γ_K · Σ|x·w| of the double sum.
TEST(W4Bf16Test, Bf16MatmulMatchesTheDoubleSum) {
  std::mt19937 rng(24);
  std::normal_distribution<float> d(0.f, 1.f);
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{{16, 33, 96}, {70, 1000, 512}, {1, 5, 7}}) {
    std::vector<uint16_t> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
    for (auto& v : x) v = F32ToBf16(d(rng));
    for (auto& v : w) v = F32ToBf16(d(rng) * 0.01f);
    std::vector<float> y(static_cast<size_t>(m * n), -1.f);
    if (!GemmBf16XWt(m, n, k, x.data(), w.data(), y.data())) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t t = 0; t < k; ++t) {
          const double p = static_cast<double>(Bf16ToF32(x[i * k + t])) * Bf16ToF32(w[j * k + t]);
          acc += p;
          mag += std::fabs(p);
        }
        ASSERT_LE(std::fabs(y[i * n + j] - acc), nibble_test::Fp32Gamma(k) * mag + 1e-30)
            << "m=" << m << " n=" << n << " k=" << k << " y[" << i << "][" << j << "]";
      }
  }
}

// Batched decode: every M from 1 to 16 against the oracle at each group size the kernel serves,
// with odd N (tails of the 2-row blocks) and odd numbers of groups (K not a multiple of 128 at
// g = 32, 96); and a row's result is the same bits whatever batch it shares a kernel with: among
// the first M rows, at any slot among 7 other rows. That keeps a sequence's logits independent of
// the other sequences of a batched step of 2 rows or more. A row alone (M = 1) at g % 128 == 0
// runs the decode loop, another fixed order than the blocks (docs/KERNELS.md "bf16 activations"):
// there the selection does not give the blocks' bits, and only the oracle is checked.
TEST(W4Bf16Test, BatchesOfOneToSixteenRowsAndRowsIndependentOfTheBatch) {
  const W4GemmBf16Kernel fast = FastKernel();
  if (fast == nullptr) GTEST_SKIP() << "no AVX-512 BF16 kernel on this CPU: " << ActiveW4Dispatch().gemm_bf16_reason;
  std::mt19937 rng(23);
  std::normal_distribution<float> xd(0.f, 1.f);
  for (int64_t g : {32, 64, 96, 128, 256}) {
    for (int64_t n : {5, 19}) {
      const int64_t k = g * (g >= 128 ? 3 : 5);
      for (bool sym : {false, true}) {
        constexpr int64_t kRows = 16;
        const BatchCase c(rng, xd, n, k, g, sym, kRows);
        const Int4Matrix& m = c.m;
        const Packed& p = c.p;
        const std::vector<float>& x = c.x;
        const PreparedRows& rows = c.rows;
        const float* b = c.b();
        std::vector<float> yall(static_cast<size_t>(kRows * n));
        fast(p.w, rows.acts.data(), kRows, b, yall.data(), 0, n);
        for (int64_t mr = 1; mr <= kRows; ++mr) {
          std::vector<float> y(static_cast<size_t>(mr * n));
          fast(p.w, rows.acts.data(), mr, b, y.data(), 0, n);
          for (int64_t i = 0; i < mr; ++i) {
            const Ref ref = Oracle(m, x.data() + i * k, b);
            for (int64_t j = 0; j < n; ++j) {
              ASSERT_LE(std::fabs(y[i * n + j] - ref.y[j]), ref.tol[j])
                  << "g=" << g << " n=" << n << " k=" << k << " sym=" << sym << " M=" << mr << " y[" << i << "][" << j << "]";
            }
          }
          const bool decode_loop = mr < kW4Bf16BlockMinRows && g % 128 == 0;
          if (!decode_loop) {
            EXPECT_EQ(std::memcmp(y.data(), yall.data(), y.size() * 4), 0) << "g=" << g << " n=" << n << " M=" << mr;
          }
        }
        // Row 0 at every slot of an 8-row batch of other rows (rows 8..14), against row 0 of the
        // 16-row batch.
        for (int64_t slot = 0; slot < 8; ++slot) {
          std::vector<W4Bf16Acts> batch;
          for (int64_t i = 0; i < 7; ++i) batch.push_back(rows.acts[static_cast<size_t>(8 + i)]);
          batch.insert(batch.begin() + slot, rows.acts[0]);
          std::vector<float> y(static_cast<size_t>(8 * n));
          fast(p.w, batch.data(), 8, b, y.data(), 0, n);
          EXPECT_EQ(std::memcmp(y.data() + slot * n, yall.data(), static_cast<size_t>(n) * 4), 0) << "g=" << g << " slot " << slot;
        }
      }
    }
  }
}

// The many-row kernel's block shape only orders the (activation row, weight row) pairs: every
// shape up to 4 weight rows × 8 activation rows, the default included, gives each pair the bits of
// 2 × 4 blocks (the shape before 2 × 8), for M = 2..16 (remainders of N and M in smaller blocks),
// odd N and more than 64 groups (the zero-point corrections are added per 64 groups). Shapes of
// more than 8 pairs keep their running sums on the stack, the others in registers: both covered.
TEST(W4Bf16Test, EveryBlockShapeGivesTheBitsOfTwoByFourBlocks) {
  if (FastKernel() == nullptr) GTEST_SKIP() << "no AVX-512 BF16 kernel on this CPU: " << ActiveW4Dispatch().gemm_bf16_reason;
  std::mt19937 rng(29);
  std::normal_distribution<float> xd(0.f, 1.f);
  constexpr int64_t kRows = 16, n = 11;
  for (int64_t g : {128, 256}) {
    const int64_t k = g * 67;
    for (bool sym : {false, true}) {
      const BatchCase c(rng, xd, n, k, g, sym, kRows);
      const Packed& p = c.p;
      const PreparedRows& rows = c.rows;
      const float* b = c.b();
      for (int64_t mr = 2; mr <= kRows; ++mr) {
        std::vector<float> ref(static_cast<size_t>(mr * n)), y(ref.size());
        GemmW4Bf16Avx512Blocks(p.w, rows.acts.data(), mr, b, ref.data(), 0, n, {2, 4});
        GemmW4Bf16Avx512<StreamPrefetch::kNonTemporal>(p.w, rows.acts.data(), mr, b, y.data(), 0, n);
        EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0) << "g=" << g << " sym=" << sym << " M=" << mr << " default";
        for (int64_t nj = 1; nj <= kW4Bf16BlockMaxRows; ++nj) {
          for (int64_t mi = 1; mi <= kW4Bf16BlockMaxActs; ++mi) {
            std::fill(y.begin(), y.end(), std::nanf(""));
            GemmW4Bf16Avx512Blocks(p.w, rows.acts.data(), mr, b, y.data(), 0, n, {nj, mi});
            EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0)
                << "g=" << g << " sym=" << sym << " M=" << mr << " shape " << nj << "x" << mi;
          }
        }
      }
    }
  }
}

// Whether this CPU's vdpbf16ps is two fp32 FMAs per lane, the high words' product first (as
// Intel's SDM writes it), checked on operands of mixed sign and magnitude.
__attribute__((target("avx512f,avx512bf16"))) bool Dpbf16IsTwoFmas() {
  std::mt19937 rng(41);
  std::normal_distribution<float> d(0.f, 1.f);
  for (int it = 0; it < 2000; ++it) {
    alignas(64) uint16_t a[32], x[32];
    alignas(64) float acc[16], got[16];
    for (int i = 0; i < 32; ++i) {
      a[i] = static_cast<uint16_t>(0x4300 | (rng() & 15));
      x[i] = F32ToBf16(std::ldexp(d(rng), static_cast<int>(rng() % 40) - 20));
    }
    for (int l = 0; l < 16; ++l) acc[l] = it % 3 == 0 ? 0.f : std::ldexp(d(rng), static_cast<int>(rng() % 50) - 20);
    _mm512_store_ps(got, _mm512_dpbf16_ps(_mm512_load_ps(acc), (__m512bh)_mm512_load_si512(a),
                                          (__m512bh)_mm512_load_si512(x)));
    for (int l = 0; l < 16; ++l) {
      float e = std::fma(Bf16ToF32(a[2 * l + 1]), Bf16ToF32(x[2 * l + 1]), acc[l]);
      e = std::fma(Bf16ToF32(a[2 * l]), Bf16ToF32(x[2 * l]), e);
      if (std::memcmp(&e, &got[l], 4) != 0) return false;
    }
  }
  return true;
}

// The FMA blocks (Intel without AMX) against the vdpbf16ps blocks: the same bits for every shape,
// M = 2..16, g = 128 / 256 / 384 (K chunks of 4, 2 and 1 groups), strips with remainders (N = 37),
// subnormal activations (read as zero by both) — where this CPU's vdpbf16ps is two FMAs, as
// Intel's is; elsewhere within the oracle's bound.
TEST(W4Bf16Test, FmaBlocksGiveTheBitsOfTheDpbf16Blocks) {
  if (FastKernel() == nullptr) GTEST_SKIP() << "no AVX-512 BF16 kernel on this CPU: " << ActiveW4Dispatch().gemm_bf16_reason;
  const bool exact = Dpbf16IsTwoFmas();
  constexpr auto kFma = W4Bf16BlockArith::kFma;
  std::mt19937 rng(43);
  std::normal_distribution<float> xd(0.f, 1.f);
  constexpr int64_t kRows = 16;
  for (int64_t g : {128, 256, 384}) {
    const int64_t n = g == 128 ? 37 : 11, k = g * 67;
    for (bool sym : {false, true}) {
      BatchCase c(rng, xd, n, k, g, sym, kRows);
      c.x[5] = 1e-39f;  // subnormal in bf16 too
      c.x[k + 40] = -3e-39f;
      for (int64_t i = 2 * k; i < 3 * k; ++i) c.x[i] = (i % 3 == 0 ? -1e-39f : 2e-39f);  // row 2 all subnormal
      c.rows = PreparedRows(c.x.data(), kRows, k, g);
      const float* b = c.b();
      for (int64_t mr = 2; mr <= kRows; ++mr) {
        std::vector<float> ref(static_cast<size_t>(mr * n)), y(ref.size());
        GemmW4Bf16Avx512Blocks(c.p.w, c.rows.acts.data(), mr, b, ref.data(), 0, n, {2, 4});
        const auto check = [&](const char* what) {
          if (exact) {
            EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0) << "g=" << g << " sym=" << sym << " M=" << mr << " " << what;
            return;
          }
          for (int64_t i = 0; i < mr; ++i) {
            if (i == 2) continue;  // the oracle keeps subnormals
            const Ref o = Oracle(c.m, c.x.data() + i * k, b);
            for (int64_t j = 0; j < n; ++j) ASSERT_LE(std::fabs(y[i * n + j] - o.y[j]), o.tol[j]) << what;
          }
        };
        GemmW4Bf16Avx512<StreamPrefetch::kL1, kFma>(c.p.w, c.rows.acts.data(), mr, b, y.data(), 0, n);
        check("selection");
        if (mr != 3 && mr != 8 && mr != kRows) continue;
        for (int64_t nj = 1; nj <= kW4Bf16BlockMaxRows; ++nj)
          for (int64_t mi = 1; mi <= kW4Bf16BlockMaxActs; ++mi) {
            std::fill(y.begin(), y.end(), std::nanf(""));
            GemmW4Bf16Avx512Blocks(c.p.w, c.rows.acts.data(), mr, b, y.data(), 0, n, {nj, mi}, kFma);
            check("shape");
          }
      }
    }
  }
}

TEST(W4Bf16Test, ThreadsAndInt4LinearAndUnsupportedGroupSizes) {
  std::mt19937 rng(22);
  std::normal_distribution<float> xd(0.f, 1.f);
  const Int4Matrix w = nibble_test::RandomInt4Matrix(rng, 1000, 512, 128, false);
  Packed p(w);
  // More than one chunk of kW4ChunkRows, and past the bf16 matmul's threshold.
  const int64_t rows = std::max<int64_t>(70, Int4Linear::Bf16MatmulMinRows() + 6);
  std::vector<float> x(static_cast<size_t>(512 * rows));
  for (auto& v : x) v = xd(rng);
  PreparedRows prepared(x.data(), rows, 512, 128);
  const std::vector<W4Bf16Acts>& a = prepared.acts;
  const W4Kernels* avx512 = W4KernelsFor(Isa::kAvx512);
  const bool fast = FastKernel() != nullptr;
  const bool linear_fast = ActiveW4Dispatch().kernels.gemm_bf16 != nullptr;  // what Int4Linear runs
  const int saved = omp_get_max_threads();
  if (fast)
    for (int64_t m : {int64_t{1}, int64_t{3}, rows}) {
      std::vector<float> y1(static_cast<size_t>(1000 * m)), y2(y1.size());
      omp_set_num_threads(1);
      GemmW4Bf16Packed(p.w, a.data(), m, nullptr, y1.data(), avx512);
      omp_set_num_threads(2);
      GemmW4Bf16Packed(p.w, a.data(), m, nullptr, y2.data(), avx512);
      EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << "m=" << m;
    }
  omp_set_num_threads(saved);

  // Int4Linear with the switch on. Below Bf16MatmulMinRows(): the bf16 kernel (without one, the
  // W4A32 path on bf16-rounded x), within the oracle's tolerance (γ_{K/16+16} times magnitudes at
  // least 25 times Σ|x·w|, which also covers any fp32 order of K terms). From there on the weight
  // is rounded to bf16 too (relative error <= 2^-8 per weight) and summed in any fp32 order:
  // |y − oracle| <= (2^-8 + γ_{K+1}·(1 + 2^-8)) · (Σ|x̂·w| + |b|).
  std::vector<float> bias(1000);
  for (auto& v : bias) v = xd(rng);
  Int4Linear lin(w, bias, "test");
  ASSERT_TRUE(lin.SetBf16Activations(true));
  std::vector<float> wd(static_cast<size_t>(1000 * 512));
  DequantizeRef(w, wd.data());
  for (int64_t m : {int64_t{1}, int64_t{3}, Int4Linear::Bf16MatmulMinRows() - 1, Int4Linear::Bf16MatmulMinRows(), rows}) {
    std::vector<float> y(static_cast<size_t>(m * 1000));
    lin.Forward(x.data(), m, y.data());
    const bool matmul = m >= Int4Linear::Bf16MatmulMinRows();
    EXPECT_EQ(lin.Bf16KernelServes(m), linear_fast && !matmul) << "m=" << m;
    const bool amx = lin.Bf16KernelServes(m) && W4Bf16AmxServes(p.w, m);
    for (int64_t i = 0; i < m; i += std::max<int64_t>(1, m - 1)) {
      const Ref ref = Oracle(w, x.data() + i * 512, bias.data(), amx ? AmxChain(512, 128) : 0);
      for (int64_t j = 0; j < 1000; ++j) {
        double tol = ref.tol[static_cast<size_t>(j)];
        if (matmul) {
          double mag = std::fabs(bias[static_cast<size_t>(j)]);
          for (int64_t t = 0; t < 512; ++t)
            mag += std::fabs(Bf16ToF32(F32ToBf16(x[static_cast<size_t>(i * 512 + t)])) * wd[static_cast<size_t>(j * 512 + t)]);
          tol = (std::ldexp(1.0, -8) + nibble_test::Fp32Gamma(513) * (1 + std::ldexp(1.0, -8))) * mag;
        }
        ASSERT_LE(std::fabs(y[static_cast<size_t>(i * 1000 + j)] - ref.y[static_cast<size_t>(j)]), tol)
            << "m=" << m << " y[" << i << "][" << j << "]";
      }
    }
    if (linear_fast && !matmul) {  // the kernel's own result for those rows, bit for bit
      std::vector<float> yr(y.size());
      GemmW4Bf16Packed(p.w, a.data(), m, bias.data(), yr.data());
      EXPECT_EQ(std::memcmp(yr.data(), y.data(), y.size() * 4), 0) << "m=" << m;
    }
  }
  // Off again: the W4A32 result, bit for bit.
  EXPECT_FALSE(lin.SetBf16Activations(false));
  std::vector<float> y32(1000), yl(1000);
  GemmW4A32Packed({1, &p.w, x.data(), bias.data(), y32.data()});
  lin.Forward(x.data(), 1, yl.data());
  EXPECT_EQ(std::memcmp(y32.data(), yl.data(), 4000), 0);
  // Group sizes that are not multiples of 32 stay W4A32.
  for (int64_t g : {16, 48}) {
    const Int4Matrix wg = nibble_test::RandomInt4Matrix(rng, 8, 384, g, true);
    Int4Linear lg(wg, {}, "g");
    EXPECT_FALSE(lg.SetBf16Activations(true)) << "g=" << g;
  }
}

}  // namespace
}  // namespace nibble
