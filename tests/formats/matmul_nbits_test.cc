// MatMulNBits repacking (SPEC §5) against hand-computed bytes.
#include "formats/matmul_nbits.h"

#include <gtest/gtest.h>

namespace nibble {
namespace {

// Codes c[n][k] = (n + k) % 16, scales 0.5 + g, zero points (n + 2g) % 16.
Int4Matrix Known(int64_t n, int64_t k, int64_t g, bool symmetric) {
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = symmetric;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) m.codes.push_back(static_cast<uint8_t>((r + c) % 16));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k / g; ++j) {
      m.scales.push_back(0.5f + static_cast<float>(j));
      m.zero_points.push_back(symmetric ? 8 : static_cast<uint8_t>((r + 2 * j) % 16));
    }
  return m;
}

TEST(MatMulNBits, AsymmetricOddBlockCountPacksCodesAndZeroNibbles) {
  const Int4Matrix m = Known(2, 48, 16, false);  // k_blocks = 3 (odd)
  auto w = ToMatMulNBits(m, "layer");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->block_size, 16);
  EXPECT_EQ(w->k_blocks, 3);
  ASSERT_EQ(w->b.size(), 2u * 3 * 8);
  EXPECT_EQ(w->b[0], 0x10);  // row 0: codes 0 (low), 1 (high)
  EXPECT_EQ(w->b[1], 0x32);
  EXPECT_EQ(w->b[8], 0x10);  // block 1 starts at k = 16: codes 16 % 16 = 0, 1
  EXPECT_EQ(w->b[24], 0x21);  // row 1: codes 1, 2
  EXPECT_EQ(w->b[24 + 7], 0x0f);  // row 1, k = 14, 15: codes 15, 0
  ASSERT_EQ(w->scales, (std::vector<float>{0.5f, 1.5f, 2.5f, 0.5f, 1.5f, 2.5f}));
  // Zero points row 0: 0, 2, 4 -> bytes 0x20, 0x04; row 1: 1, 3, 5 -> 0x31, 0x05.
  EXPECT_EQ(w->zero_points, (std::vector<uint8_t>{0x20, 0x04, 0x31, 0x05}));
}

TEST(MatMulNBits, SymmetricHasNoZeroPointsAndKeepsCodes) {
  const Int4Matrix m = Known(1, 32, 32, true);
  auto w = ToMatMulNBits(m, "layer");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_TRUE(w->zero_points.empty());
  EXPECT_EQ(w->b[15], 0xfe);  // codes 30 % 16 = 14, 15: ORT's default zero 8 = nibble's
}

TEST(MatMulNBits, PerChannelRowIsPaddedToOneBlock) {
  const Int4Matrix m = Known(1, 40, 40, false);  // K = 40: block 64, K padded with code 0
  auto w = ToMatMulNBits(m, "layer");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->block_size, 64);
  EXPECT_EQ(w->k_blocks, 1);
  ASSERT_EQ(w->b.size(), 32u);
  EXPECT_EQ(w->b[19], 0x76);  // k = 38, 39: codes 6, 7
  for (size_t i = 20; i < 32; ++i) EXPECT_EQ(w->b[i], 0) << i;
  EXPECT_EQ(w->zero_points, (std::vector<uint8_t>{0x00}));
}

TEST(MatMulNBits, PerChannelLongRowRepeatsItsScalePerBlock) {
  const Int4Matrix m = Known(1, 384, 384, false);
  auto w = ToMatMulNBits(m, "layer");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->block_size, 128);
  EXPECT_EQ(w->scales, (std::vector<float>{0.5f, 0.5f, 0.5f}));
}

TEST(MatMulNBits, RefusesGroupSizesAndActOrderItCannotHold) {
  auto bad = ToMatMulNBits(Known(1, 96, 48, false), "model.layers.0.mlp.up_proj");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("model.layers.0.mlp.up_proj has group_size 48"), std::string::npos);
  EXPECT_NE(bad.error().message.find("re-quantize"), std::string::npos);
  Int4Matrix act = Known(1, 32, 16, false);
  act.g_idx.assign(32, 0);
  for (int i = 0; i < 16; ++i) act.g_idx[static_cast<size_t>(2 * i + 1)] = 1;
  auto a = ToMatMulNBits(act, "model.layers.1.self_attn.q_proj");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("model.layers.1.self_attn.q_proj has an act-order g_idx"), std::string::npos);
}

}  // namespace
}  // namespace nibble
