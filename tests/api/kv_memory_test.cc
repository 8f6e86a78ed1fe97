// The KV memory model: a session's KV bytes follow its ctx_size and the positions it holds, not
// max_position_embeddings; bf16 KV against fp32 KV on the embedded model; the --max_memory
// refusal; memory sizes as --max_memory takes them.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_paths.h"
#include "api/load_or_fail.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace {

std::unique_ptr<nibble::Model> LoadWithKv(const std::string& dir, nibble::KvDtype kv) {
  nibble::LoadOptions lo;
  lo.kv_dtype = kv;
  return nibble_test::LoadOrFail(dir, lo);
}

TEST(KvMemory, FollowsCtxSizeNotMaxPositionEmbeddings) {
  nibble_test::TempDir tmp;
  nibble_test::TinyLlamaSpec spec;  // 2 layers, 2 kv heads of head_dim 8
  spec.max_pos = 131072;
  nibble_test::WriteTinyModel(tmp.path(), spec);
  for (nibble::KvDtype kv : {nibble::KvDtype::kBf16, nibble::KvDtype::kFp32}) {
    auto m = LoadWithKv(tmp.path(), kv);
    ASSERT_NE(m, nullptr);
    const int64_t bytes = kv == nibble::KvDtype::kBf16 ? 2 : 4;
    const int64_t per_pos = 2 * 2 * 2 * 8 * bytes;  // K and V, layers, kv heads, head_dim
    EXPECT_EQ(nibble::DefaultContextSize(*m), 8192);
    EXPECT_EQ(nibble::KvCacheBytes(*m, 512), 512 * per_pos);
    for (int64_t ctx : {int64_t{512}, int64_t{0}, int64_t{131072}}) {
      nibble::SessionOptions so;
      so.context = ctx;
      auto s = nibble::Session::Create(*m, so);
      ASSERT_TRUE(s.ok()) << s.error().message;
      EXPECT_EQ((*s)->capacity(), ctx == 0 ? 8192 : ctx);
      EXPECT_EQ((*s)->kv_bytes(), 0) << "storage is allocated as positions fill, ctx " << ctx;
      ASSERT_TRUE((*s)->Prefill(std::vector<int32_t>(10, 5)).ok());
      EXPECT_EQ((*s)->kv_bytes(), 256 * per_pos) << "one block of 256 positions, ctx " << ctx;
      ASSERT_TRUE((*s)->Prefill(std::vector<int32_t>(300, 7)).ok());
      EXPECT_EQ((*s)->kv_bytes(), 512 * per_pos) << "two blocks, ctx " << ctx;
    }
  }
}

// The logits of `ids` prefilled, then of each of `steps` greedy tokens, and those tokens.
struct GreedyRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};
GreedyRun Greedy(const nibble::Model& m, const std::vector<int32_t>& ids, int steps) {
  GreedyRun r;
  auto s = nibble::Session::Create(m);
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return r;
  EXPECT_TRUE((*s)->Prefill(ids).ok());
  nibble::SamplingOptions greedy;
  greedy.temperature = 0;
  for (int i = 0; i < steps; ++i) {
    r.logits.push_back((*s)->logits());
    auto next = (*s)->Sample(greedy);
    EXPECT_TRUE(next.ok());
    if (!next.ok()) return r;
    r.tokens.push_back(*next);
    EXPECT_TRUE((*s)->Step(*next).ok());
  }
  return r;
}

// bf16 rounds each K/V value once (relative error <= 2^-9); through softmax and the layers the
// logits of the embedded model move by well under 0.05 and the greedy tokens stay the same.
TEST(KvMemory, Bf16KvMatchesFp32KvOnTheEmbeddedModel) {
  auto bf = LoadWithKv(nibble_test::EmbeddedModel(), nibble::KvDtype::kBf16);
  auto fp = LoadWithKv(nibble_test::EmbeddedModel(), nibble::KvDtype::kFp32);
  ASSERT_NE(bf, nullptr);
  ASSERT_NE(fp, nullptr);
  EXPECT_EQ(bf->info().kv_dtype, nibble::KvDtype::kBf16);
  auto ids = bf->Tokenize("And God said unto Moses, Speak unto the children of Israel, that they");
  ASSERT_TRUE(ids.ok());
  const GreedyRun a = Greedy(*bf, *ids, 24), b = Greedy(*fp, *ids, 24);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  float worst = 0;
  bool differ = false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    for (size_t j = 0; j < a.logits[i].size(); ++j) {
      worst = std::max(worst, std::fabs(a.logits[i][j] - b.logits[i][j]));
      differ = differ || a.logits[i][j] != b.logits[i][j];
    }
  EXPECT_LT(worst, 0.05f);
  EXPECT_TRUE(differ) << "bf16 KV gave the fp32 logits bit for bit: is the cache really bf16?";
}

TEST(KvMemory, MaxMemoryRefusesUpFrontWithTheNumbers) {
  auto m = LoadWithKv(nibble_test::EmbeddedModel(), nibble::KvDtype::kBf16);
  ASSERT_NE(m, nullptr);
  nibble::SessionOptions so;
  so.context = 256;
  const int64_t need = nibble::KvCacheBytes(*m, 256);
  so.max_memory = need - 1;
  auto refused = nibble::Session::Create(*m, so);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, nibble::ErrorCode::kResourceExhausted);
  const std::string& msg = refused.error().message;
  EXPECT_NE(msg.find(std::to_string(need) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(need - 1) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("256 positions"), std::string::npos) << msg;
  so.max_memory = need;
  EXPECT_TRUE(nibble::Session::Create(*m, so).ok());
  EXPECT_FALSE(nibble::CheckKvMemory(*m, 1 << 20, need).ok());
}

TEST(KvMemory, ParsesMemorySizes) {
  const std::pair<const char*, int64_t> good[] = {{"512", 512},        {"16GB", 16000000000},  {"512MiB", 512 << 20},
                                                  {"1.5GiB", 1610612736}, {"2kb", 2000},      {"3TiB", int64_t{3} << 40}};
  for (const auto& [text, bytes] : good) {
    auto r = nibble::ParseMemorySize(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.error().message;
    EXPECT_EQ(*r, bytes) << text;
  }
  for (const char* bad : {"", "GB", "12 GB", "-1GB", "1.2.3", "5XB", "1e3"}) {
    auto r = nibble::ParseMemorySize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find(std::string("\"") + bad + "\""), std::string::npos) << r.error().message;
  }
}

}  // namespace
