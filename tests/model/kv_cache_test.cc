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

// A cancelled forward pass stops before a layer with kCancelled and leaves the cache at its old
// length: running the same tokens again gives the logits of a run never cancelled.
TEST(KvCache, CancelledForwardKeepsTheLastCompletePosition) {
  auto loaded = LlamaModel::Load(nibble_test::EmbeddedModel());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const LlamaModel& m = **loaded;
  const int64_t vocab = m.config().vocab_size;
  const std::vector<int32_t> first = {1, 50, 60, 70}, second = {80, 90, 100};
  KvCache cache = m.NewCache(64).value(), fresh = m.NewCache(64).value();
  std::vector<float> a(static_cast<size_t>(vocab)), b(a.size());
  ASSERT_TRUE(m.Forward(first.data(), 4, cache, a.data(), false).ok());
  CancellationToken cancel;
  cancel.Cancel();
  const Status s = m.Forward(second.data(), 3, cache, a.data(), false, &cancel);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kCancelled) << s.error().message;
  EXPECT_EQ(cache.length, 4);
  ASSERT_TRUE(m.Forward(second.data(), 3, cache, a.data(), false, nullptr).ok());
  ASSERT_TRUE(m.Forward(first.data(), 4, fresh, b.data(), false).ok());
  ASSERT_TRUE(m.Forward(second.data(), 3, fresh, b.data(), false).ok());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace nibble
