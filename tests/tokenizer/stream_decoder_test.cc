// StreamDecoder (tokenizer/stream_decoder.h) on the shipped tokenizers: multi-byte characters
// split over byte-fallback tokens (emoji, CJK) come out whole, no piece is invalid UTF-8, the
// pieces concatenate to Decode of all ids, and they match step by step the definition (re-decode
// everything, emit the new suffix unless it ends in U+FFFD) on random id sequences, also for a
// tokenizer whose start-of-text rule spans several pieces; the work per id stays bounded on long
// streams.
#include "tokenizer/stream_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace nibble {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// The embedded model's tokenizer, and stories260K's where ../shared has it.
std::vector<std::string> ShippedDirs() {
  std::vector<std::string> dirs = {nibble_test::EmbeddedModel()};
  if (nibble_test::MissingShared({"models/stories260K"}).empty()) dirs.push_back(nibble_test::SharedModel("stories260K"));
  return dirs;
}

std::unique_ptr<Tokenizer> LoadOrDie(const std::string& dir) {
  auto r = Tokenizer::Load(dir);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : nullptr;
}

// One string per Push, then the Flush.
std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& context,
                                const std::vector<int32_t>& ids) {
  StreamDecoder d(tok, context);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(d.Push(id));
  out.push_back(d.Flush());
  return out;
}

// The definition: decode the whole sequence each step and emit what is new, unless the text ends
// in U+FFFD (an incomplete sequence) before the final step.
std::vector<std::string> Reference(const Tokenizer& tok, std::vector<int32_t> all, const std::vector<int32_t>& ids) {
  size_t shown = tok.Decode(all).size();
  std::vector<std::string> out;
  for (size_t i = 0; i <= ids.size(); ++i) {
    const bool final = i == ids.size();
    if (!final) all.push_back(ids[i]);
    const std::string text = tok.Decode(all);
    if (text.size() <= shown || (!final && std::string_view(text).ends_with(kReplacementChar))) {
      out.emplace_back();
      continue;
    }
    out.push_back(text.substr(shown));
    shown = text.size();
  }
  return out;
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p;
  return s;
}

// Checks the stream of `ids` after `context` against Decode and the definition.
void CheckStream(const Tokenizer& tok, const std::vector<int32_t>& context, const std::vector<int32_t>& ids,
                 const std::string& what) {
  const std::vector<std::string> pieces = Stream(tok, context, ids);
  std::vector<int32_t> all = context;
  all.insert(all.end(), ids.begin(), ids.end());
  const std::string whole = tok.Decode(all);
  const size_t context_size = tok.Decode(context).size();
  ASSERT_GE(whole.size(), context_size) << what;
  EXPECT_EQ(Join(pieces), whole.substr(context_size)) << what;
  EXPECT_EQ(pieces, Reference(tok, context, ids)) << what;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(FirstInvalidUtf8(pieces[i]), -1) << what << ", piece " << i;
    if (i + 1 < pieces.size()) {
      EXPECT_FALSE(std::string_view(pieces[i]).ends_with(kReplacementChar)) << what;
    }
  }
}

// Emoji and CJK are byte-fallback tokens in both shipped vocabularies: the first bytes of a
// character give no text, the last one gives the whole character.
TEST(StreamDecoder, MultiByteCharactersComeOutWhole) {
  const std::vector<std::string> texts = {
      "emoji \xF0\x9F\x98\x80 and \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD!",  // 😀 👍🏽
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",                          // 日本語
      "caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x98\x80\xF0\x9F\x98\x80 end",
  };
  for (const std::string& dir : ShippedDirs()) {
    auto tok = LoadOrDie(dir);
    ASSERT_NE(tok, nullptr);
    for (const auto& text : texts) {
      auto ids = tok->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.error().message;
      const std::vector<std::string> pieces = Stream(*tok, {}, *ids);
      EXPECT_EQ(Join(pieces), text) << dir;
      int held = 0;  // byte pieces that gave no text (the start of a character)
      for (size_t i = 0; i < pieces.size(); ++i) {
        EXPECT_EQ(FirstInvalidUtf8(pieces[i]), -1) << dir << ": " << text;
        EXPECT_EQ(pieces[i].find(kReplacementChar), std::string::npos) << dir << ": " << text;
        if (i < ids->size() && pieces[i].empty() && tok->Decode({(*ids)[i]}) == kReplacementChar) ++held;
      }
      EXPECT_GT(held, 0) << dir << ": no byte-fallback split in " << text;
      CheckStream(*tok, {}, *ids, dir + ": " + text);
    }
  }
}

TEST(StreamDecoder, ContinuationAfterPrompt) {
  for (const std::string& dir : ShippedDirs()) {
    auto tok = LoadOrDie(dir);
    ASSERT_NE(tok, nullptr);
    auto prompt = tok->Encode("Once upon a time");
    auto more = tok->Encode(" there was \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 a girl.", false);
    ASSERT_TRUE(prompt.ok() && more.ok());
    CheckStream(*tok, *prompt, *more, dir);
    // The first generated piece keeps its leading space after a prompt, loses it after BOS alone.
    auto word = tok->Encode("the", false);
    ASSERT_TRUE(word.ok());
    EXPECT_EQ(Join(Stream(*tok, *prompt, *word)), " the") << dir;
    EXPECT_EQ(Join(Stream(*tok, {tok->bos_id()}, *word)), "the") << dir;
  }
}

TEST(StreamDecoder, IncompleteSequenceIsHeldUntilFlush) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  auto tok = LoadOrDie(nibble_test::SharedModel("stories260K"));
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("x\xF0\x9F\x98\x80", false);  // x😀: the emoji as 4 byte pieces
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 5u);
  ids->pop_back();  // drop the last byte: the sequence can no longer complete
  StreamDecoder d(*tok);
  std::string shown;
  for (size_t i = 0; i + 3 < ids->size(); ++i) shown += d.Push((*ids)[i]);
  EXPECT_EQ(shown, "x");
  for (size_t i = ids->size() - 3; i < ids->size(); ++i) EXPECT_EQ(d.Push((*ids)[i]), "");
  const std::string rest = d.Flush();
  EXPECT_NE(rest.find(kReplacementChar), std::string::npos);
  EXPECT_EQ(shown + rest, tok->Decode(*ids));
  EXPECT_EQ(d.Flush(), "");
}

// Random ids, half of them low ids (control and byte-fallback pieces), a quarter space pieces:
// lone continuation bytes, truncated sequences, BOS/EOS/unk and runs of spaces mid-stream.
TEST(StreamDecoder, RandomIdsMatchDefinition) {
  for (const std::string& dir : ShippedDirs()) {
    auto tok = LoadOrDie(dir);
    ASSERT_NE(tok, nullptr);
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> any(0, tok->vocab_size() - 1), low(0, 300), len(0, 48);
    auto prompt = tok->Encode("Once upon a time");
    auto spaces = tok->Encode(" a  b   \n c    ", false);  // space pieces of several lengths
    ASSERT_TRUE(prompt.ok() && spaces.ok());
    std::uniform_int_distribution<size_t> space(0, spaces->size() - 1);
    const std::vector<std::vector<int32_t>> contexts = {{}, {tok->bos_id()}, *prompt};
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids(static_cast<size_t>(len(rng)));
      for (auto& id : ids) {
        const uint32_t pick = rng() % 4;
        id = pick == 0 ? any(rng) : pick == 1 ? (*spaces)[space(rng)] : low(rng);
      }
      const std::vector<int32_t>& context = contexts[static_cast<size_t>(trial % 3)];
      CheckStream(*tok, context, ids, dir + ", trial " + std::to_string(trial));
      if (HasFailure()) return;
    }
  }
}

// A tokenizer whose start-of-text rule reaches past the first piece: Decode drops every leading
// space (as SentencePiece does with remove_extra_whitespaces), so a window that starts at a
// space piece decodes differently from the whole sequence; the stream must still match.
class LeadingSpaceTokenizer final : public Tokenizer {
 public:
  LeadingSpaceTokenizer() : Tokenizer(SpecialTokens{0, {1}, true, false}) {}
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (!IsSpecial(id)) s += kPieces[static_cast<size_t>(id)];
    }
    return s.substr(std::min(s.size(), s.find_first_not_of(' ')));
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(std::size(kPieces)); }
  bool IsSpecial(int32_t id) const override { return id == 0 || id == 1; }
  std::string Piece(int32_t id) const override { return id >= 0 && id < vocab_size() ? kPieces[static_cast<size_t>(id)] : ""; }
  const char* kind_name() const override { return "test"; }

 protected:
  Result<std::vector<int32_t>> EncodeText(const std::string&) const override { return MakeError("unused"); }

 private:
  static constexpr const char* kPieces[] = {"<s>", "</s>", " ", "  ", "a", " b", "c ", "\n"};
};

TEST(StreamDecoder, LeadingSpaceRuleMatchesDefinition) {
  LeadingSpaceTokenizer tok;
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> any(0, tok.vocab_size() - 1), len(0, 24);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids(static_cast<size_t>(len(rng)));
    for (auto& id : ids) id = any(rng);
    CheckStream(tok, trial % 2 ? std::vector<int32_t>{0} : std::vector<int32_t>{}, ids, "trial " + std::to_string(trial));
    if (HasFailure()) return;
  }
}

// Forwards to a tokenizer and counts the ids it decodes.
class CountingTokenizer final : public Tokenizer {
 public:
  explicit CountingTokenizer(const Tokenizer& inner) : Tokenizer(inner.special_tokens()), inner_(inner) {}
  std::string Decode(const std::vector<int32_t>& ids) const override {
    decoded_ids += static_cast<int64_t>(ids.size());
    return inner_.Decode(ids);
  }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  bool IsSpecial(int32_t id) const override { return inner_.IsSpecial(id); }
  std::string Piece(int32_t id) const override { return inner_.Piece(id); }
  const char* kind_name() const override { return inner_.kind_name(); }
  mutable int64_t decoded_ids = 0;

 protected:
  Result<std::vector<int32_t>> EncodeText(const std::string& text) const override { return inner_.Encode(text, false); }

 private:
  const Tokenizer& inner_;
};

TEST(StreamDecoder, LongStreamDecodesBoundedWindows) {
  auto inner = LoadOrDie(nibble_test::EmbeddedModel());
  ASSERT_NE(inner, nullptr);
  CountingTokenizer tok(*inner);
  std::string text;
  for (int i = 0; i < 400; ++i) text += "Once upon a time, caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80. ";
  auto ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 4000u);
  StreamDecoder d(tok);
  std::string shown;
  for (int32_t id : *ids) shown += d.Push(id);
  shown += d.Flush();
  EXPECT_EQ(shown, text);
  EXPECT_LT(tok.decoded_ids, 16 * static_cast<int64_t>(ids->size()));  // whole re-decodes: n^2 / 2
}

}  // namespace
}  // namespace nibble
