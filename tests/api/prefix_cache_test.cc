// PrefixCache on the embedded model: the longest cached prefix, LRU eviction within the byte
// budget, named errors, and concurrent Acquire / Insert (reuse_test_util.h has the reference).
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/reuse_test_util.h"

namespace {

using namespace nibble_test;  // NOLINT: the helpers of these tests

TEST(PrefixCache, AcquireGivesTheLongestCachedPrefix) {
  for (nibble::KvDtype kv : {nibble::KvDtype::kFp32, nibble::KvDtype::kBf16}) {
    const nibble::Model& m = ModelWith(kv);
    const Ids base = RandomIds(m, 300, 11), other = RandomIds(m, 20, 12);
    nibble::PrefixCache cache(m, int64_t{1} << 30);
    auto s1 = Prefilled(m, {Slice(base, 0, 100)});
    Ids forty = Slice(base, 0, 40);
    forty.insert(forty.end(), other.begin(), other.end());
    auto s2 = Prefilled(m, {Slice(base, 0, 40), other});
    ASSERT_TRUE(*cache.Insert(*s1));
    ASSERT_TRUE(*cache.Insert(*s2));
    EXPECT_EQ(cache.entries(), 2);

    auto hit = cache.Acquire(Slice(base, 0, 120));
    ASSERT_TRUE(hit.ok()) << hit.error().message;
    EXPECT_EQ(hit->cached_tokens, 100);
    EXPECT_EQ(hit->session->tokens(), Slice(base, 0, 100));
    ASSERT_TRUE(hit->session->Prefill(Slice(base, 100, 120)).ok());
    auto fresh = Prefilled(m, {Slice(base, 0, 100), Slice(base, 100, 120)});
    EXPECT_TRUE(SameBits(hit->session->logits(), fresh->logits()));
    ExpectSameContinuation(*hit->session, *fresh, 4);

    Ids forty_five = forty;
    forty_five.resize(45);
    hit = cache.Acquire(forty_five);
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(hit->cached_tokens, 44);  // all cached but the last, which must run for its logits
    hit = cache.Acquire(Slice(base, 0, 100));
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(hit->cached_tokens, 100);  // all cached with the logits: nothing to run
    EXPECT_TRUE(SameBits(hit->session->logits(), s1->logits()));
    hit = cache.Acquire({base[0] == 5 ? 6 : 5, 9});
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(hit->cached_tokens, 0);
    EXPECT_EQ(hit->session->position(), 0);
  }
}

TEST(PrefixCache, EvictsTheLeastRecentlyUsedWithinItsBudget) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  const int64_t n = 64;
  const int64_t entry = nibble::KvCacheBytes(m, n) + 4 * (n + m.info().vocab_size);
  nibble::PrefixCache cache(m, entry * 5 / 2);
  std::vector<Ids> ids;
  std::vector<std::unique_ptr<nibble::Session>> s;
  for (uint32_t i = 0; i < 3; ++i) {
    ids.push_back(RandomIds(m, static_cast<size_t>(n), 100 + i));
    ids.back()[0] = static_cast<int32_t>(10 + i);  // no two share a first id
    s.push_back(Prefilled(m, {ids.back()}));
  }
  ASSERT_TRUE(*cache.Insert(*s[0]));
  ASSERT_TRUE(*cache.Insert(*s[1]));
  EXPECT_EQ(cache.bytes(), 2 * entry);
  ASSERT_EQ(cache.Acquire(ids[0])->cached_tokens, n);  // 0 is now more recent than 1
  ASSERT_TRUE(*cache.Insert(*s[2]));
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_LE(cache.bytes(), cache.max_bytes());
  EXPECT_EQ(cache.Acquire(ids[1])->cached_tokens, 0);
  EXPECT_EQ(cache.Acquire(ids[0])->cached_tokens, n);
  EXPECT_EQ(cache.Acquire(ids[2])->cached_tokens, n);
  // A prefix of an entry is not stored again; an extension replaces the entry it holds.
  EXPECT_FALSE(*cache.Insert(*s[0], n / 2));
  ASSERT_TRUE(s[0]->Prefill({7, 8}).ok());
  ASSERT_TRUE(*cache.Insert(*s[0]));
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_EQ(cache.Acquire(s[0]->tokens())->cached_tokens, n + 2);
  // A snapshot above the whole budget is declined.
  nibble::PrefixCache tiny(m, entry - 1);
  EXPECT_FALSE(*tiny.Insert(*s[1]));
  EXPECT_EQ(tiny.entries(), 0);
  EXPECT_EQ(tiny.bytes(), 0);
}

TEST(PrefixCache, BadRequestsAreNamedErrors) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  nibble::PrefixCache cache(m, int64_t{1} << 30);
  auto hit = cache.Acquire({});
  ASSERT_FALSE(hit.ok());
  EXPECT_NE(hit.error().message.find("Acquire: no tokens"), std::string::npos) << hit.error().message;
  auto empty = NewSession(m, 16);
  auto r = cache.Insert(*empty);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("nothing to store"), std::string::npos) << r.error().message;
  ASSERT_TRUE(empty->Prefill({1, 2, 3}).ok());
  r = cache.Insert(*empty, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("position 4 is outside [0, 3]"), std::string::npos) << r.error().message;
  const nibble::Model& other = ModelWith(nibble::KvDtype::kFp32);
  auto s = NewSession(other, 16);
  ASSERT_TRUE(s->Prefill({1, 2}).ok());
  r = cache.Insert(*s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("another model"), std::string::npos) << r.error().message;
  nibble::SessionOptions o;
  o.context = 2;
  ASSERT_TRUE(*cache.Insert(*empty));
  hit = cache.Acquire({1, 2, 3, 4}, o);  // 3 cached positions do not fit a context of 2
  ASSERT_FALSE(hit.ok());
  EXPECT_NE(hit.error().message.find("context 2 cannot hold the 3 positions"), std::string::npos) << hit.error().message;
}

// Four threads acquire, extend and insert prefixes of one text under a budget that evicts:
// every hit holds a prefix of its request, and what it continues to equals a fresh prefill.
TEST(PrefixCache, ConcurrentAcquireAndInsertStayConsistent) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  const Ids base = RandomIds(m, 48, 21);
  const int64_t entry = nibble::KvCacheBytes(m, 48) + 4 * (48 + m.info().vocab_size);
  nibble::PrefixCache cache(m, entry * 3);
  std::atomic<int> failures{0}, hits{0};
  auto worker = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    nibble::SessionOptions o;
    o.context = 64;
    o.threads = 1;
    for (int i = 0; i < 12; ++i) {
      const size_t len = 8 + rng() % 40;
      Ids request = Slice(base, 0, len);
      if (rng() % 3 == 0) request.back() = request.back() == 5 ? 6 : 5;  // a branch off the text
      auto hit = cache.Acquire(request, o);
      if (!hit.ok()) {
        ADD_FAILURE() << hit.error().message;
        ++failures;
        continue;
      }
      nibble::Session& s = *hit->session;
      const auto k = static_cast<size_t>(hit->cached_tokens);
      if (s.position() != hit->cached_tokens || s.tokens() != Slice(request, 0, k) ||
          (k == len && s.logits().empty()))
        ADD_FAILURE() << "request of " << len << " ids: a hit of " << k << " at position " << s.position(), ++failures;
      hits += k > 0;
      if (k < len && !s.Prefill(Slice(request, k, len)).ok()) ++failures;
      if (auto in = cache.Insert(s); !in.ok()) ADD_FAILURE() << in.error().message, ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(worker, 31 + t);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_LE(cache.bytes(), cache.max_bytes());
  // Whatever the cache holds now continues as well as a fresh context does (greedy, a bound: the
  // entries were prefilled in chunks that depend on the threads' order).
  auto hit = cache.Acquire(base);
  ASSERT_TRUE(hit.ok());
  if (hit->cached_tokens < 48) {
    ASSERT_TRUE(hit->session->Prefill(Slice(base, static_cast<size_t>(hit->cached_tokens), 48)).ok());
  }
  auto fresh = Prefilled(m, {base});
  float diff = 0, scale = 0;
  for (size_t j = 0; j < fresh->logits().size(); ++j) {
    diff = std::max(diff, std::abs(hit->session->logits()[j] - fresh->logits()[j]));
    scale = std::max(scale, std::abs(fresh->logits()[j]));
  }
  EXPECT_LE(diff, 1e-3f * scale);
}

}  // namespace
