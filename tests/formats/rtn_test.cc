// Quark RTN reference quantizer: SPEC test vectors TV-1 (asymmetric) and TV-4 (symmetric ties),
// golden vectors from an independent Python model of the same arithmetic (bf16/fp16 rounding of
// the scale and of mn/s, fp32 x * (1/s) + z, half-even), scale dtype rounding, edge cases, errors.
#include "formats/rtn.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/float_dtype.h"
#include "formats/int4_matrix.h"
#include "formats/quark_format.h"

namespace nibble {
namespace {

QuantSpec Spec(bool sym, int64_t g) {
  QuantSpec s;
  s.symmetric = sym;
  s.group_size = g;
  return s;
}

// TV-1 (SPEC §7): W [2, 16], g = 8, uint4.
const float kTv1W[2 * 16] = {-1.0f, -0.75f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 2.75f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f, 3.75f,
                             -2.0f, -1.5f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.75f, -3.75f, -3.0f, -2.0f, -1.0f, 0.0f, -0.25f, -0.5f, -1.5f};
const std::vector<uint8_t> kTv1Codes = {0, 1, 2, 4, 6, 8, 12, 15, 2, 4, 6, 8, 10, 12, 14, 15,
                                        0, 2, 4, 6, 8, 10, 12, 15, 0, 3, 7, 11, 15, 14, 13, 9};
const std::vector<uint8_t> kTv1Zeros = {4, 0, 8, 15};  // [N, G]: row0 g0, row0 g1, row1 g0, row1 g1

TEST(RtnTest, Tv1AsymmetricCodesZerosScales) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto r = QuantizeRtnRef(kTv1W, 2, 16, Spec(false, 8), dt);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->n, 2);
    EXPECT_EQ(r->k, 16);
    EXPECT_EQ(r->group_size, 8);
    EXPECT_FALSE(r->symmetric);
    EXPECT_EQ(r->codes, kTv1Codes) << DTypeName(dt);
    EXPECT_EQ(r->zero_points, kTv1Zeros) << DTypeName(dt);
    EXPECT_EQ(r->scales, std::vector<float>(4, 0.25f)) << DTypeName(dt);
    std::vector<float> deq(32);
    DequantizeRef(*r, deq.data());
    for (int i = 0; i < 32; ++i) EXPECT_EQ(deq[i], kTv1W[i]) << i;  // TV-1 reproduces W exactly
  }
}

TEST(RtnTest, Tv4SymmetricHalfEvenTies) {
  // amax = 0.9375 → s = 0.125; w/s = 7.5, -7.5, 2.5, -2.5, 1.5, 0.5, -0.5, 0.
  const float w[8] = {0.9375f, -0.9375f, 0.3125f, -0.3125f, 0.1875f, 0.0625f, -0.0625f, 0.0f};
  const int q_half_even[8] = {7, -8, 2, -2, 2, 0, 0, 0};  // TV-4 half-even column
  auto r = QuantizeRtnRef(w, 1, 8, Spec(true, 8), DType::kBF16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->symmetric);
  ASSERT_EQ(r->scales.size(), 1u);
  EXPECT_EQ(r->scales[0], 0.125f);
  EXPECT_EQ(r->zero_points, std::vector<uint8_t>{8});
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int{r->codes[i]} - 8, q_half_even[i]) << "w = " << w[i];
}

// Group where rounding mn/s to bf16 before rint changes z (fp32 path gives z = 5).
const float kZRoundingGroup[8] = {0x1.fap-7f, 0x1.42p-6f, -0x1.0ep-5f, 0x1.6p-4f, 0x1.c8p-6f, 0x1.eap-5f, -0x1.fcp-6f, -0x1.2ep-5f};
const float kZRoundingScale = 0x1.0cp-7f;  // bf16
const uint8_t kZRoundingZero = 4;
const uint8_t kZRoundingCodes[8] = {6, 6, 0, 15, 7, 11, 0, 0};
const float kGoldW[3 * 32] = {
    -0x1.1ap-6f, -0x1.5cp-8f, 0x1.02p-5f, 0x1.98p-7f, -0x1.6ep-6f, -0x1.88p-5f, -0x1.aap-6f, 0x1.f4p-5f, -0x1.4ap-5f, 0x1.92p-7f, 0x1.5ep-6f, -0x1.32p-4f, 0x1.3ep-9f, 0x1.0cp-4f, -0x1.9cp-4f, -0x1.08p-6f, -0x1.5cp-8f, -0x1.4ep-5f, 0x1.98p-6f, -0x1.98p-9f, -0x1.2cp-4f, 0x1.54p-5f, 0x1.12p-5f, 0x1.84p-5f, 0x1.28p-4f, 0x1.28p-6f, 0x1.86p-8f, -0x1.0ap-4f, 0x1.f8p-6f, -0x1.f6p-6f, -0x1.72p-6f, -0x1.04p-4f,
    -0x1.8cp-5f, -0x1.b4p-6f, 0x1.08p-4f, -0x1.ap-4f, -0x1.2ap-4f, 0x1.88p-7f, 0x1.28p-4f, 0x1.dap-6f, -0x1.86p-4f, -0x1.02p-3f, 0x1.24p-6f, -0x1.2ep-5f, -0x1.cap-5f, 0x1.9p-5f, 0x1.c4p-5f, 0x1.02p-7f, 0x1.92p-7f, 0x1.64p-6f, 0x1.46p-4f, 0x1.fcp-6f, 0x1.a8p-6f, 0x1.cp-6f, -0x1.42p-4f, 0x1.06p-4f, 0x1.88p-5f, 0x1.b2p-6f, -0x1.94p-4f, -0x1.04p-5f, 0x1.5ap-5f, -0x1.72p-4f, -0x1.2ep-7f, 0x1.a2p-5f,
    -0x1.0cp-4f, 0x1.4ap-4f, 0x1.c4p-6f, -0x1.ecp-8f, 0x1.0ap-6f, 0x1.0ap-5f, 0x1.8ap-8f, 0x1.d6p-5f, -0x1.0ep-5f, -0x1.54p-6f, 0x1.aap-5f, 0x1.6p-10f, -0x1.68p-5f, 0x1.84p-5f, 0x1.2cp-4f, -0x1.6cp-6f, -0x1.1ap-4f, -0x1.bap-8f, -0x1.e8p-8f, -0x1.e8p-7f, 0x1.2p-4f, -0x1.a4p-5f, 0x1.02p-4f, -0x1.04p-4f, -0x1.42p-5f, 0x1.02p-5f, 0x1.cep-5f, 0x1.6p-5f, 0x1.1ap-6f, 0x1.d2p-8f, 0x1.f4p-8f, 0x1.d8p-6f,
};
const float kGoldBF16AsymScales[] = {0x1.6ap-7f, 0x1.3ep-7f, 0x1.b2p-7f, 0x1.84p-7f, 0x1.4p-7f, 0x1.2ep-7f};
const uint8_t kGoldBF16AsymZeros[] = {9, 8, 10, 8, 7, 7};
const uint8_t kGoldBF16AsymCodes[] = {7, 9, 12, 10, 7, 5, 7, 15, 5, 10, 11, 2, 9, 15, 0, 8, 7, 4, 11, 8, 0, 12, 11, 13, 15, 10, 9, 1, 11, 5, 6, 1, 6, 8, 15, 2, 5, 11, 15, 12, 3, 0, 11, 7, 6, 14, 14, 11, 9, 10, 15, 11, 10, 10, 1, 13, 12, 10, 0, 5, 12, 0, 7, 12, 0, 15, 10, 6, 9, 10, 8, 13, 4, 5, 12, 7, 2, 12, 14, 5, 0, 6, 6, 5, 15, 1, 14, 0, 3, 10, 13, 12, 9, 8, 8, 10};
const float kGoldBF16SymScales[] = {0x1.b8p-7f, 0x1.4p-7f, 0x1.14p-6f, 0x1.aep-7f, 0x1.6p-7f, 0x1.34p-7f};
const uint8_t kGoldBF16SymZeros[] = {8, 8, 8, 8, 8, 8};
const uint8_t kGoldBF16SymCodes[] = {7, 8, 10, 9, 6, 4, 6, 13, 5, 9, 10, 2, 8, 13, 1, 7, 7, 4, 11, 8, 0, 12, 11, 13, 15, 10, 9, 1, 11, 5, 6, 2, 5, 6, 12, 2, 4, 9, 12, 10, 2, 1, 9, 6, 5, 11, 11, 8, 9, 10, 14, 10, 10, 10, 2, 13, 12, 10, 0, 6, 11, 1, 7, 12, 2, 15, 11, 7, 10, 11, 9, 13, 5, 6, 13, 8, 4, 12, 15, 6, 1, 7, 7, 6, 15, 3, 15, 1, 4, 11, 14, 13, 10, 9, 9, 11};
const float kGoldF16AsymScales[] = {0x1.6acp-7f, 0x1.3dcp-7f, 0x1.b1p-7f, 0x1.854p-7f, 0x1.3fp-7f, 0x1.3p-7f};
const uint8_t kGoldF16AsymZeros[] = {9, 8, 10, 8, 7, 7};
const uint8_t kGoldF16AsymCodes[] = {7, 9, 12, 10, 7, 5, 7, 15, 5, 10, 11, 2, 9, 15, 0, 8, 7, 4, 11, 8, 0, 12, 11, 13, 15, 10, 9, 1, 11, 5, 6, 1, 6, 8, 15, 2, 4, 11, 15, 12, 3, 0, 11, 7, 6, 14, 14, 11, 9, 10, 15, 11, 10, 10, 1, 13, 12, 10, 0, 5, 12, 0, 7, 12, 0, 15, 10, 6, 9, 10, 8, 13, 4, 5, 12, 7, 2, 12, 15, 5, 0, 6, 6, 5, 15, 1, 14, 0, 3, 10, 13, 12, 9, 8, 8, 10};
const float kGoldF16SymScales[] = {0x1.b78p-7f, 0x1.4p-7f, 0x1.134p-6f, 0x1.afp-7f, 0x1.6p-7f, 0x1.334p-7f};
const uint8_t kGoldF16SymZeros[] = {8, 8, 8, 8, 8, 8};
const uint8_t kGoldF16SymCodes[] = {7, 8, 10, 9, 6, 4, 6, 13, 5, 9, 10, 2, 8, 13, 1, 7, 7, 4, 11, 8, 0, 12, 11, 13, 15, 10, 9, 1, 11, 5, 6, 2, 5, 6, 12, 2, 4, 9, 12, 10, 2, 1, 9, 6, 5, 11, 11, 8, 9, 10, 14, 10, 10, 10, 2, 13, 12, 10, 1, 6, 11, 1, 7, 12, 2, 15, 11, 7, 10, 11, 9, 13, 5, 6, 13, 8, 4, 12, 15, 6, 1, 7, 7, 6, 15, 3, 15, 1, 4, 11, 14, 13, 10, 9, 9, 11};

void ExpectGolden(DType dt, bool sym, const float* scales, const uint8_t* zeros, const uint8_t* codes) {
  auto r = QuantizeRtnRef(kGoldW, 3, 32, Spec(sym, 16), dt);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r->scales[i], scales[i]) << DTypeName(dt) << " sym=" << sym << " group " << i;
    EXPECT_EQ(r->zero_points[i], zeros[i]) << DTypeName(dt) << " sym=" << sym << " group " << i;
  }
  for (int i = 0; i < 96; ++i) EXPECT_EQ(r->codes[i], codes[i]) << DTypeName(dt) << " sym=" << sym << " element " << i;
}

TEST(RtnTest, GoldenVectorsFromIndependentModel) {
  ExpectGolden(DType::kBF16, false, kGoldBF16AsymScales, kGoldBF16AsymZeros, kGoldBF16AsymCodes);
  ExpectGolden(DType::kBF16, true, kGoldBF16SymScales, kGoldBF16SymZeros, kGoldBF16SymCodes);
  ExpectGolden(DType::kF16, false, kGoldF16AsymScales, kGoldF16AsymZeros, kGoldF16AsymCodes);
  ExpectGolden(DType::kF16, true, kGoldF16SymScales, kGoldF16SymZeros, kGoldF16SymCodes);
}

TEST(RtnTest, ZeroPointUsesModelDtypeDivision) {
  // Quark divides mn / s in the weight dtype before torch.round; an fp32 division gives z = 5.
  auto r = QuantizeRtnRef(kZRoundingGroup, 1, 8, Spec(false, 8), DType::kBF16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->scales[0], kZRoundingScale);
  EXPECT_EQ(r->zero_points[0], kZRoundingZero);
  EXPECT_EQ(r->codes, std::vector<uint8_t>(kZRoundingCodes, kZRoundingCodes + 8));
}

TEST(RtnTest, ScaleIsRoundedToScaleDtypeBeforeUse) {
  // Range [-1, 2] → s = 3 / 15 = 0.2, which no binary format holds exactly.
  const float w[8] = {-1.0f, -0.5f, 0.0f, 0.3f, 0.7f, 1.1f, 1.5f, 2.0f};
  const float want[3] = {0.2f, 0.199951171875f, 0.2001953125f};  // fp32, fp16, bf16 nearest of 0.2
  const DType dts[3] = {DType::kF32, DType::kF16, DType::kBF16};
  for (int d = 0; d < 3; ++d) {
    auto r = QuantizeRtnRef(w, 1, 8, Spec(false, 8), dts[d]);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->scales[0], want[d]) << DTypeName(dts[d]);
    EXPECT_EQ(RoundToDType(r->scales[0], dts[d]), r->scales[0]);
    // Codes are consistent with the stored scale: round-trip error at most s/2 in range.
    std::vector<float> deq(8);
    DequantizeRef(*r, deq.data());
    for (int i = 0; i < 8; ++i) EXPECT_LE(std::fabs(deq[i] - w[i]), r->scales[0] * 0.5f + 1e-7f) << i;
  }
}

TEST(RtnTest, AllZeroGroupHasFiniteScaleAndExactZeros) {
  std::vector<float> w(2 * 16, 0.0f);
  for (int i = 8; i < 16; ++i) w[i] = 0.5f * static_cast<float>(i - 10);  // row 0 group 1 non-zero
  for (bool sym : {false, true}) {
    auto r = QuantizeRtnRef(w.data(), 2, 16, Spec(sym, 8), DType::kBF16);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->scales[0], 1.1920928955078125e-07f);  // eps = 2^-23
    EXPECT_EQ(r->scales[2], 1.1920928955078125e-07f);
    std::vector<float> deq(32);
    DequantizeRef(*r, deq.data());
    for (int i : {0, 1, 7, 16, 31}) {
      EXPECT_EQ(deq[i], 0.0f) << i;
      EXPECT_FALSE(std::signbit(deq[i])) << i;
    }
    EXPECT_EQ(deq[10], 0.0f);  // the zero inside a non-zero group stays exact
  }
}

TEST(RtnTest, PerChannelIsOneGroupPerRow) {
  QuantSpec spec = Spec(false, -1);
  spec.granularity = Granularity::kPerChannel;
  auto r = QuantizeRtnRef(kTv1W, 2, 16, spec, DType::kF32);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->group_size, 16);
  ASSERT_EQ(r->scales.size(), 2u);
  // Row 0: range [-1, 3.75] → s = 4.75 / 15; row 1: [-3.75, 1.75] → s = 5.5 / 15 (fp32).
  EXPECT_EQ(r->scales[0], 4.75f / 15.0f);
  EXPECT_EQ(r->scales[1], 5.5f / 15.0f);
  EXPECT_EQ(r->zero_points[0], 3);   // -round(-1 / 0.31667) = round(3.158) = 3
  EXPECT_EQ(r->zero_points[1], 10);  // round(3.75 / 0.36667) = round(10.227) = 10
  EXPECT_EQ(r->codes[15], 15);       // 3.75 / s + 3 = 14.84 → 15
  EXPECT_EQ(r->codes[16 + 8], 0);    // -3.75 / s + 10 = -0.227 → 0
  // group_size -1 with per_group is the same grouping.
  auto same = QuantizeRtnRef(kTv1W, 2, 16, Spec(false, -1), DType::kF32);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->codes, r->codes);
}

TEST(RtnTest, ClampsOutliersIntoRange) {
  // Symmetric: +amax maps to 7.5 → 8 → clamped to 7; -amax to -8.
  const float w[4] = {3.0f, -3.0f, 2.9f, -0.1f};
  auto r = QuantizeRtnRef(w, 1, 4, Spec(true, 4), DType::kF32);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->codes[0], 15);
  EXPECT_EQ(r->codes[1], 0);
  for (uint8_t c : r->codes) EXPECT_LE(c, 15);
}

void ExpectRtnError(Result<Int4Matrix> r, const std::vector<std::string>& fragments) {
  ASSERT_FALSE(r.ok());
  for (const auto& f : fragments) EXPECT_NE(r.error().message.find(f), std::string::npos) << "missing \"" << f << "\" in: " << r.error().message;
}

TEST(RtnTest, Errors) {
  std::vector<float> w(8 * 100, 0.5f);
  ExpectRtnError(QuantizeRtnRef(w.data(), 8, 100, Spec(false, 32), DType::kBF16),
                 {"not aligned with group_size 32", "N = 8", "K = 100", "g = 32"});
  ExpectRtnError(QuantizeRtnRef(w.data(), 8, 100, Spec(false, 0), DType::kBF16), {"invalid group_size 0"});
  ExpectRtnError(QuantizeRtnRef(w.data(), 8, 96, Spec(false, 32), DType::kI32), {"scale dtype I32"});
  ExpectRtnError(QuantizeRtnRef(w.data(), 0, 96, Spec(false, 32), DType::kF32), {"N >= 1"});
  // A Quark spec whose dtype contradicts `symmetric` has no neutral spec (the parser refuses it
  // too); the same words as before.
  WeightQuantSpec mismatched;
  mismatched.dtype = QuantDType::kUint4;
  mismatched.symmetric = true;
  auto neutral = QuantSpecFromQuark(mismatched);
  ASSERT_FALSE(neutral.ok());
  EXPECT_NE(neutral.error().message.find("uint4 with symmetric true"), std::string::npos) << neutral.error().message;
  WeightQuantSpec floor_round;
  floor_round.round_method = "floor";
  auto floor_spec = QuantSpecFromQuark(floor_round);
  ASSERT_TRUE(floor_spec.ok());
  ExpectRtnError(QuantizeRtnRef(w.data(), 8, 96, *floor_spec, DType::kF32), {"round_method \"floor\""});
  w[3 * 96 + 40] = std::nanf("");
  ExpectRtnError(QuantizeRtnRef(w.data(), 8, 96, Spec(false, 32), DType::kF32), {"weight[3][40]", "not finite"});
  std::vector<float> big(32, 0.0f);
  big[0] = 3.0e38f;  // F32 range is fine, but s = 2e37 overflows F16
  ExpectRtnError(QuantizeRtnRef(big.data(), 1, 32, Spec(false, 32), DType::kF16), {"overflows F16"});
  EXPECT_TRUE(QuantizeRtnRef(big.data(), 1, 32, Spec(false, 32), DType::kF32).ok());
}

}  // namespace
}  // namespace nibble
