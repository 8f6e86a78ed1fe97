// Helpers of the prefix-reuse tests (Session::Fork, KeepCommonPrefix, PrefixCache) on the
// embedded model. Their reference is a fresh session prefilling the same ids in the same chunks:
// the K/V of a position depends only on the ids before it and on how they were run, so a reused
// context must give the same logits bit for bit, and a missed, shifted or stale row shows.
#pragma once

#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "api/load_or_fail.h"
#include "test_paths.h"

namespace nibble_test {

using Ids = std::vector<int32_t>;

inline const nibble::Model& ModelWith(nibble::KvDtype kv) {
  static std::unique_ptr<nibble::Model> bf16, fp32;
  std::unique_ptr<nibble::Model>& m = kv == nibble::KvDtype::kBf16 ? bf16 : fp32;
  if (m == nullptr) {
    nibble::LoadOptions o;
    o.kv_dtype = kv;
    m = nibble_test::LoadOrFail(nibble_test::EmbeddedModel(), o);
  }
  return *m;
}

// `n` ids drawn from the vocabulary (past the special ids) with `seed`.
inline Ids RandomIds(const nibble::Model& m, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(m.info().vocab_size) - 1);
  Ids out(n);
  for (int32_t& t : out) t = id(rng);
  return out;
}

// ids[from, to).
inline Ids Slice(const Ids& ids, size_t from, size_t to) {
  return Ids(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.begin() + static_cast<std::ptrdiff_t>(to));
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::unique_ptr<nibble::Session> NewSession(const nibble::Model& m, int64_t context = 0) {
  nibble::SessionOptions o;
  o.context = context;
  auto s = nibble::Session::Create(m, o);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? std::move(s).value() : nullptr;
}

// A fresh session that prefilled `chunks` one after the other.
inline std::unique_ptr<nibble::Session> Prefilled(const nibble::Model& m, const std::vector<Ids>& chunks) {
  auto s = NewSession(m);
  for (const Ids& c : chunks) EXPECT_TRUE(s->Prefill(c).ok());
  return s;
}

// Greedy steps on both sessions: the same ids and the same logits, bit for bit, at every step.
inline void ExpectSameContinuation(nibble::Session& a, nibble::Session& b, int steps) {
  nibble::SamplingOptions greedy;
  greedy.temperature = 0;
  for (int i = 0; i < steps; ++i) {
    auto ta = a.Sample(greedy), tb = b.Sample(greedy);
    ASSERT_TRUE(ta.ok() && tb.ok());
    ASSERT_EQ(*ta, *tb) << "step " << i;
    ASSERT_TRUE(a.Step(*ta).ok() && b.Step(*tb).ok());
    ASSERT_TRUE(SameBits(a.logits(), b.logits())) << "step " << i;
  }
}

}  // namespace nibble_test
