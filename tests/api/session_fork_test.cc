// Session::Fork and KeepCommonPrefix on the embedded model against fresh prefills of the same ids
// (reuse_test_util.h): forks at a block boundary and inside blocks, fp32 and bf16 KV.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "api/reuse_test_util.h"

namespace {

using namespace nibble_test;  // NOLINT: the helpers of these tests

struct ForkCase {
  nibble::KvDtype kv;
  int64_t at;  // the fork position: a block boundary (256), inside a block, inside the first
};

void PrintTo(const ForkCase& c, std::ostream* os) {
  *os << (c.kv == nibble::KvDtype::kBf16 ? "bf16" : "fp32") << " KV, fork at " << c.at;
}

class ForkTest : public ::testing::TestWithParam<ForkCase> {};

// A fork at `at` of a session that went on past it continues exactly as a fresh session that
// prefilled the same first `at` ids; the source is untouched by the fork's steps.
TEST_P(ForkTest, ContinuesAsAFreshPrefillOfTheSameIds) {
  const ForkCase c = GetParam();
  const nibble::Model& m = ModelWith(c.kv);
  const Ids ids = RandomIds(m, 400, 7);
  const auto at = static_cast<size_t>(c.at);
  auto source = Prefilled(m, {Slice(ids, 0, at), Slice(ids, at, 380)});
  const std::vector<float> source_logits = source->logits();
  auto fork = source->Fork(c.at);
  ASSERT_TRUE(fork.ok()) << fork.error().message;
  nibble::Session& f = **fork;
  EXPECT_EQ(f.position(), c.at);
  EXPECT_EQ(f.capacity(), source->capacity());
  EXPECT_EQ(f.tokens(), Slice(ids, 0, at));
  EXPECT_TRUE(f.logits().empty());
  EXPECT_EQ(f.kv_bytes(), nibble::KvCacheBytes(m, (c.at + 255) / 256 * 256));
  ASSERT_TRUE(f.Prefill(Slice(ids, at, at + 20)).ok());
  auto fresh = Prefilled(m, {Slice(ids, 0, at), Slice(ids, at, at + 20)});
  ASSERT_TRUE(SameBits(f.logits(), fresh->logits()));
  ExpectSameContinuation(f, *fresh, 12);
  // The fork wrote over rows it copied; the source still continues from its own 380 ids.
  EXPECT_EQ(source->position(), 380);
  EXPECT_TRUE(SameBits(source->logits(), source_logits));
  auto source_again = Prefilled(m, {Slice(ids, 0, at), Slice(ids, at, 380)});
  ExpectSameContinuation(*source, *source_again, 4);
}

// shared_logits: a holder's buffer stays as it was through later Steps, Truncate and a fork's
// steps (they write fresh buffers); with no other holder a Step writes in place. Values against
// fresh prefills of the same chunks.
TEST(SharedLogits, AHeldBufferIsNeverOverwritten) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  const Ids ids = RandomIds(m, 40, 3);
  auto s = Prefilled(m, {Slice(ids, 0, 30)});
  EXPECT_EQ(Prefilled(m, {})->shared_logits(), nullptr);
  std::shared_ptr<const std::vector<float>> held = s->shared_logits();
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->data(), s->logits().data());  // the session's own buffer, not a copy
  const std::vector<float> at30 = *held;
  auto fork = s->Fork();
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ((*fork)->shared_logits(), held);  // the fork shares it
  ASSERT_TRUE(s->Step(ids[30]).ok());
  ASSERT_TRUE((*fork)->Prefill(Slice(ids, 30, 35)).ok());
  EXPECT_TRUE(SameBits(*held, at30));
  EXPECT_NE(s->logits().data(), held->data());
  EXPECT_TRUE(SameBits(s->logits(), Prefilled(m, {Slice(ids, 0, 30), Slice(ids, 30, 31)})->logits()));
  EXPECT_TRUE(SameBits((*fork)->logits(), Prefilled(m, {Slice(ids, 0, 30), Slice(ids, 30, 35)})->logits()));
  // Held by no one else: the next step writes into the session's buffer in place.
  held.reset();
  const float* in_place = s->logits().data();
  ASSERT_TRUE(s->Step(ids[31]).ok());
  EXPECT_EQ(s->logits().data(), in_place);
  EXPECT_TRUE(SameBits(s->logits(), Prefilled(m, {Slice(ids, 0, 30), Slice(ids, 30, 31), Slice(ids, 31, 32)})->logits()));
  held = s->shared_logits();
  const std::vector<float> at32 = *held;
  ASSERT_TRUE(s->Truncate(10).ok());
  EXPECT_TRUE(s->logits().empty());
  EXPECT_TRUE(SameBits(*held, at32));
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, ForkTest,
                         ::testing::Values(ForkCase{nibble::KvDtype::kFp32, 256}, ForkCase{nibble::KvDtype::kFp32, 300},
                                           ForkCase{nibble::KvDtype::kBf16, 256}, ForkCase{nibble::KvDtype::kBf16, 300},
                                           ForkCase{nibble::KvDtype::kBf16, 37}),
                         [](const ::testing::TestParamInfo<ForkCase>& i) {
                           return std::string(i.param.kv == nibble::KvDtype::kBf16 ? "bf16" : "fp32") + "_at_" +
                                  std::to_string(i.param.at);
                         });

// A fork of everything has the logits too (and a token Generate left to run): it samples and
// generates as the source does, and Generate counts the positions it found as cached_tokens.
TEST(Fork, OfEverythingKeepsTheLogitsAndGeneratesAsTheSource) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  auto source = NewSession(m);
  nibble::GenerateOptions g;
  g.prompt = "And God said";
  g.max_new_tokens = 6;
  g.sampling.temperature = 0;
  auto first = nibble::Generate(*source, g, [](std::string_view) { return true; });
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->cached_tokens, 0);
  const int64_t held = source->position();
  auto fork = source->Fork();
  ASSERT_TRUE(fork.ok()) << fork.error().message;
  EXPECT_EQ((*fork)->position(), source->position());
  EXPECT_TRUE(SameBits((*fork)->logits(), source->logits()));
  g.prompt = " unto Moses";
  std::string a, b;
  auto ga = nibble::Generate(*source, g, [&](std::string_view p) { return a += p, true; });
  auto gb = nibble::Generate(**fork, g, [&](std::string_view p) { return b += p, true; });
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(ga->cached_tokens, held);
  EXPECT_EQ(gb->cached_tokens, held);
}

TEST(Fork, BadPositionsAndContextsAreNamedErrors) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  auto s = NewSession(m, 64);
  ASSERT_TRUE(s->Prefill({1, 100, 200, 300}).ok());
  for (int64_t bad : {int64_t{-2}, int64_t{5}}) {
    auto f = s->Fork(bad);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error().code, nibble::ErrorCode::kInvalidArgument);
    EXPECT_NE(f.error().message.find("position " + std::to_string(bad) + " is outside [0, 4]"), std::string::npos)
        << f.error().message;
  }
  nibble::SessionOptions small;
  small.context = 3;
  auto f = s->Fork(4, small);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("context 3 cannot hold the 4 positions"), std::string::npos) << f.error().message;
  nibble::SessionOptions tight;
  tight.context = 64;
  tight.max_memory = nibble::KvCacheBytes(m, 64) - 1;
  f = s->Fork(2, tight);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, nibble::ErrorCode::kResourceExhausted) << f.error().message;
  auto empty = s->Fork(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->position(), 0);
  EXPECT_EQ((*empty)->kv_bytes(), 0);
}

// The longest common prefix, less one when the last position's logits would be lost.
TEST(Session, KeepCommonPrefixKeepsWhatAPromptCanReuse) {
  const nibble::Model& m = ModelWith(nibble::KvDtype::kBf16);
  const Ids ids = RandomIds(m, 40, 3);
  auto s = Prefilled(m, {Slice(ids, 0, 10)});
  const std::vector<float> at10 = s->logits();
  EXPECT_EQ(s->CommonPrefix(Slice(ids, 0, 10)), 10);  // the whole prompt, with its logits
  EXPECT_EQ(s->CommonPrefix(Slice(ids, 0, 30)), 10);
  EXPECT_EQ(s->CommonPrefix(Slice(ids, 0, 6)), 5);    // its last position must run again
  Ids other = Slice(ids, 0, 3);
  other.push_back(ids[3] == 7 ? 8 : 7);
  EXPECT_EQ(s->CommonPrefix(other), 3);
  EXPECT_EQ(s->CommonPrefix({}), 0);
  EXPECT_EQ(s->position(), 10);  // CommonPrefix changes nothing

  EXPECT_EQ(*s->KeepCommonPrefix(Slice(ids, 0, 10)), 10);
  EXPECT_TRUE(SameBits(s->logits(), at10));
  EXPECT_EQ(*s->KeepCommonPrefix(Slice(ids, 0, 6)), 5);
  EXPECT_EQ(s->position(), 5);
  EXPECT_TRUE(s->logits().empty());
  EXPECT_EQ(s->tokens(), Slice(ids, 0, 5));
  ASSERT_TRUE(s->Prefill(Slice(ids, 5, 12)).ok());
  auto fresh = Prefilled(m, {Slice(ids, 0, 10)});
  EXPECT_EQ(*fresh->KeepCommonPrefix(Slice(ids, 0, 6)), 5);
  auto reference = Prefilled(m, {Slice(ids, 0, 5), Slice(ids, 5, 12)});
  EXPECT_TRUE(SameBits(s->logits(), reference->logits()));
  EXPECT_EQ(*s->KeepCommonPrefix({}), 0);
  EXPECT_EQ(s->position(), 0);
}

// Entries of 100 and 40 + 20 ids: a request gets the longest prefix any entry holds, and
// prefilling the rest gives a fresh prefill's logits.
}  // namespace
