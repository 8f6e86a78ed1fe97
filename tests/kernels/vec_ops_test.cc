// The vectorised row ops (kernels/vec_ops.h): every ISA build that the CPU supports against the
// scalar build, bit for bit, on lengths around the 8- and 16-lane structure and at unaligned
// starts; and the dispatch decision (fake CPUs, NIBBLE_ISA) choosing each ISA's table.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/half.h"
#include "kernels/int4_dispatch.h"
#include "kernels/int4_packed.h"
#include "kernels/vec_ops.h"

namespace nibble {
namespace {

constexpr int64_t kLengths[] = {0, 1, 15, 16, 17, 1000};

template <class T>
::testing::AssertionResult SameBits(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << want[i];
  return ::testing::AssertionSuccess();
}

// n + 1 values with ~N(0, sd²); callers use [1, n + 1) to start off the vector alignment.
std::vector<float> RandomRow(std::mt19937& rng, int64_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(static_cast<size_t>(n + 1));
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<const W4Kernels*> SupportedIsas() {
  std::vector<const W4Kernels*> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (const W4Kernels* k = W4KernelsFor(isa)) out.push_back(k);
  return out;
}

TEST(VecOpsTest, EveryIsaGivesTheScalarBits) {
  const VecKernels scalar = VecKernelsScalar();
  std::mt19937 rng(11);
  for (const W4Kernels* k : SupportedIsas()) {
    const VecKernels& v = k->vec;
    ASSERT_STREQ(v.name, IsaName(k->isa));
    for (int64_t n : kLengths) {
      const std::string at = std::string(v.name) + " n=" + std::to_string(n);
      for (float shift : {0.f, -3.25f, 17.f}) {
        const std::vector<float> x = RandomRow(rng, n, 30.f);  // reaches ExpF's clamps
        std::vector<float> got = x, want = x;
        v.exp_shifted(got.data() + 1, n, shift);
        scalar.exp_shifted(want.data() + 1, n, shift);
        EXPECT_TRUE(SameBits(got, want)) << "ExpShiftedInPlace " << at << " shift=" << shift;
      }
      for (int64_t tail : {0, 3, 17}) {
        const std::vector<float> x = RandomRow(rng, n + tail, 4.f);
        std::vector<float> got = x, want = x;
        v.scaled_softmax_row(got.data() + 1, n, n + tail, 0.125f);
        scalar.scaled_softmax_row(want.data() + 1, n, n + tail, 0.125f);
        EXPECT_TRUE(SameBits(got, want)) << "ScaledSoftmaxRow " << at << " tail=" << tail;
      }
      const std::vector<float> a = RandomRow(rng, n, 1.f), b = RandomRow(rng, n, 1.f);
      const std::vector<double> got = {v.squared_error_sum(a.data() + 1, b.data() + 1, n)};
      const std::vector<double> want = {scalar.squared_error_sum(a.data() + 1, b.data() + 1, n)};
      EXPECT_TRUE(SameBits(got, want)) << "SquaredErrorSum " << at;
    }
  }
}

// Values around every case of base/half.h F32ToBf16: ties to even (both ways), carries into the
// exponent and to infinity, ±inf, quiet and signalling NaNs of either sign, subnormals, ±0.
std::vector<float> Bf16EdgeValues(std::mt19937& rng, int64_t n) {
  const uint32_t words[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3fffffffu, 0x7f7fffffu, 0xff7f8000u,
                            0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u, 0xff80ffffu, 0x00000001u,
                            0x80018000u, 0x00000000u, 0x80000000u, 0x007fffffu};
  std::vector<float> v = RandomRow(rng, n, 1000.f);
  for (size_t i = 0; i < v.size(); i += 3) std::memcpy(&v[i], &words[(i / 3) % std::size(words)], sizeof(float));
  return v;
}

TEST(VecOpsTest, Bf16RoundingOfEveryIsaIsTheScalarReference) {
  std::mt19937 rng(13);
  for (const W4Kernels* k : SupportedIsas()) {
    for (int64_t n : kLengths) {
      const std::vector<float> x = Bf16EdgeValues(rng, n);
      std::vector<uint16_t> bits(x.size(), 0), want_bits(x.size(), 0);
      std::vector<float> wide(x.size(), 0.f), want_wide(x.size(), 0.f);
      for (size_t i = 1; i < x.size(); ++i) {
        want_bits[i] = F32ToBf16(x[i]);
        want_wide[i] = Bf16ToF32(want_bits[i]);
      }
      k->vec.to_bf16_bits(x.data() + 1, n, bits.data() + 1);
      k->vec.round_to_bf16(x.data() + 1, n, wide.data() + 1);
      EXPECT_TRUE(SameBits(bits, want_bits)) << k->vec.name << " to_bf16_bits n=" << n;
      EXPECT_TRUE(SameBits(wide, want_wide)) << k->vec.name << " round_to_bf16 n=" << n;
      std::vector<float> in_place = x;  // RoundToBf16's callers round in place
      k->vec.round_to_bf16(in_place.data() + 1, n, in_place.data() + 1);
      in_place[0] = 0.f;
      EXPECT_TRUE(SameBits(in_place, want_wide)) << k->vec.name << " in place n=" << n;
    }
  }
  // The threaded entry point (blocks of 2^14 from 2^20 values) against the reference.
  const std::vector<float> x = Bf16EdgeValues(rng, (int64_t{1} << 20) + 37);
  std::vector<uint16_t> bits(x.size());
  ::nibble::ToBf16Bits(x.data(), static_cast<int64_t>(x.size()), bits.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits[i], F32ToBf16(x[i])) << i;
}

// PrepareActsBf16's arrays (VecKernels::bf16_acts) from every ISA against the layouts spelled out
// value by value: xb pairs run u's values l and 16 + l, xs (g = 128) a superblock's values
// 16c + l and 64 + 16c + l, xf the DAZ values in K order, σ each group's values added in K order.
// Groups smaller than, equal to and spanning the 128-value blocks; edge values; x off alignment.
TEST(VecOpsTest, Bf16ActsOfEveryIsaAreTheLayoutsValueByValue) {
  std::mt19937 rng(17);
  const int64_t cases[][2] = {{32, 32}, {96, 32}, {192, 64}, {384, 128}, {640, 128}, {512, 256}, {320, 160}, {1152, 1152}};
  for (const auto& [k, g] : cases) {
    const std::vector<float> x = Bf16EdgeValues(rng, k);
    std::vector<uint16_t> xb_want(static_cast<size_t>(k)), xs_want(static_cast<size_t>(k));
    std::vector<float> xf_want(static_cast<size_t>(k)), sigma_want(static_cast<size_t>(k / g), 0.f);
    for (int64_t i = 0; i < k; ++i) {
      const uint16_t b = F32ToBf16(x[static_cast<size_t>(i + 1)]);
      const int64_t u = i / 32, l = i % 32, p = i % 128, s = i / 128;
      xb_want[static_cast<size_t>(32 * u + (l < 16 ? 2 * l : 2 * (l - 16) + 1))] = b;
      if (g == 128) xs_want[static_cast<size_t>(128 * s + 32 * ((p % 64) / 16) + 2 * (p % 16) + p / 64)] = b;
      xf_want[static_cast<size_t>(i)] = Bf16ToF32((b & 0x7F80) == 0 ? static_cast<uint16_t>(b & 0x8000) : b);
      sigma_want[static_cast<size_t>(i / g)] += Bf16ToF32(b);
    }
    for (const W4Kernels* ks : SupportedIsas()) {
      const std::string at = std::string(ks->vec.name) + " k=" + std::to_string(k) + " g=" + std::to_string(g);
      std::vector<uint16_t> xb(xb_want.size(), 0x5555), xs(xs_want.size(), 0x5555);
      std::vector<float> xf(xf_want.size(), -1.f), sigma(sigma_want.size(), -1.f);
      ks->vec.bf16_acts(x.data() + 1, k, g, xb.data(), xf.data(), g == 128 ? xs.data() : nullptr, sigma.data());
      EXPECT_TRUE(SameBits(xb, xb_want)) << "xb " << at;
      EXPECT_TRUE(SameBits(xf, xf_want)) << "xf " << at;
      for (size_t gi = 0; gi < sigma.size(); ++gi)  // a NaN's sign and payload follow the adds' operand order
        if (std::isnan(sigma_want[gi]) && std::isnan(sigma[gi])) sigma[gi] = sigma_want[gi];
      EXPECT_TRUE(SameBits(sigma, sigma_want)) << "sigma " << at;
      if (g == 128) EXPECT_TRUE(SameBits(xs, xs_want)) << "xs " << at;
      else EXPECT_TRUE(std::all_of(xs.begin(), xs.end(), [](uint16_t w) { return w == 0x5555; })) << "xs written " << at;
    }
  }
}

TEST(VecOpsTest, EntryPointsRunTheActiveTable) {
  const VecKernels& active = ActiveW4Dispatch().kernels.vec;
  std::mt19937 rng(12);
  const std::vector<float> x = RandomRow(rng, 1000, 4.f), y = RandomRow(rng, 1000, 4.f);
  std::vector<float> got = x, want = x;
  ExpShiftedInPlace(got.data(), 1000, -1.5f);
  active.exp_shifted(want.data(), 1000, -1.5f);
  EXPECT_TRUE(SameBits(got, want));
  got = x, want = x;
  ScaledSoftmaxRow(got.data(), 900, 1000, 0.5f);
  active.scaled_softmax_row(want.data(), 900, 1000, 0.5f);
  EXPECT_TRUE(SameBits(got, want));
  EXPECT_EQ(SquaredErrorSum(x.data(), y.data(), 1000), active.squared_error_sum(x.data(), y.data(), 1000));
}

// The table a decision holds is exactly the named ISA's build.
void ExpectTable(const W4Dispatch& d, const char* name) {
  const VecKernels& v = d.kernels.vec;
  EXPECT_STREQ(v.name, name);
  EXPECT_STREQ(v.name, IsaName(d.kernels.isa));
  ASSERT_NE(v.exp_shifted, nullptr);
  ASSERT_NE(v.scaled_softmax_row, nullptr);
  ASSERT_NE(v.squared_error_sum, nullptr);
  const bool is_scalar = std::string(name) == "scalar";
  const VecKernels scalar = VecKernelsScalar();
  EXPECT_EQ(v.exp_shifted == scalar.exp_shifted, is_scalar) << name;
  EXPECT_EQ(v.scaled_softmax_row == scalar.scaled_softmax_row, is_scalar) << name;
  EXPECT_EQ(v.squared_error_sum == scalar.squared_error_sum, is_scalar) << name;
}

TEST(VecOpsDispatchTest, NibbleIsaForcesTheRowOps) {
  // NIBBLE_ISA=scalar gives the scalar build on the real CPU, whatever it supports.
  ExpectTable(ResolveW4Dispatch(DetectCpuFeatures(), "scalar"), "scalar");
#if defined(__x86_64__)
  CpuFeatures full;
  full.vendor = "FakeCPU";
  full.osxsave = full.os_ymm = full.os_zmm = true;
  full.avx = full.fma = full.f16c = full.avx2 = true;
  full.avx512f = full.avx512bw = full.avx512vl = full.avx512dq = true;
  ExpectTable(ResolveW4Dispatch(full, nullptr), "avx512");
  ExpectTable(ResolveW4Dispatch(full, "avx2"), "avx2");
  ExpectTable(ResolveW4Dispatch(full, "scalar"), "scalar");
  CpuFeatures avx2_only = full;
  avx2_only.avx512f = avx2_only.avx512bw = avx2_only.avx512vl = avx2_only.avx512dq = avx2_only.os_zmm = false;
  ExpectTable(ResolveW4Dispatch(avx2_only, nullptr), "avx2");
  ExpectTable(ResolveW4Dispatch(avx2_only, "avx512"), "avx2");  // refused: falls back
  ExpectTable(ResolveW4Dispatch(avx2_only, "scalar"), "scalar");
  ExpectTable(ResolveW4Dispatch(CpuFeatures{}, nullptr), "scalar");
#endif
}

}  // namespace
}  // namespace nibble
