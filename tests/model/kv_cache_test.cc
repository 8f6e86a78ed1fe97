// KV cache storage that grows in blocks as positions fill gives the logits of a cache sized for
// the whole context up front, bit for bit, in bf16 and fp32; an fp32 cache holds 4 bytes a value.
#include <gtest/gtest.h>

#include <vector>

#include "model/llama.h"
#include "test_paths.h"

namespace nibble {
namespace {

TEST(KvCache, GrowingInBlocksMatchesAPresizedCacheBitForBit) {
  auto loaded = LlamaModel::Load(nibble_test::EmbeddedModel());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  LlamaModel& m = **loaded;
  const int64_t vocab = m.config().vocab_size, ctx = 500;  // max_position_embeddings is 512
  // Chunks crossing the 256-position block edges, then decode steps across the next one.
  std::vector<int64_t> chunks = {200, 100, 150};
  for (int i = 0; i < 8; ++i) chunks.push_back(1);
  for (bool bf16 : {true, false}) {
    m.SetKvBf16(bf16);
    KvCache grown = m.NewCache(ctx).value(), presized = m.NewCache(ctx).value();
    EXPECT_EQ(grown.bytes(), 0);
    presized.Reserve(ctx);
    EXPECT_EQ(presized.bytes(), KvBytes(m.config(), ctx, bf16));
    int64_t pos = 0;
    for (int64_t t : chunks) {
      std::vector<int32_t> ids(static_cast<size_t>(t));
      for (int64_t i = 0; i < t; ++i) ids[i] = static_cast<int32_t>((pos + i) * 7919 % vocab);
      std::vector<float> a(static_cast<size_t>(vocab)), b(a.size());
      ASSERT_TRUE(m.Forward(ids.data(), t, grown, a.data(), false).ok());
      ASSERT_TRUE(m.Forward(ids.data(), t, presized, b.data(), false).ok());
      pos += t;
      EXPECT_EQ(a, b) << "bf16 " << bf16 << ", position " << pos;
      EXPECT_EQ(grown.allocated, std::min(ctx, (pos + kKvBlock - 1) / kKvBlock * kKvBlock));
    }
    EXPECT_EQ(grown.bytes(), KvBytes(m.config(), ctx, bf16));  // 458 positions: 2 blocks, capped at 500
    std::vector<int32_t> too_many(static_cast<size_t>(ctx - pos + 1), 1);
    std::vector<float> logits(static_cast<size_t>(vocab));
    EXPECT_FALSE(m.Forward(too_many.data(), static_cast<int64_t>(too_many.size()), grown, logits.data(), false).ok());
  }
  m.SetKvBf16(true);
}

}  // namespace
}  // namespace nibble
