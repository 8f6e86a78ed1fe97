// Tokenizer interface (tokenizer/tokenizer.h) with its SentencePiece implementation: the shipped
// tokenizers against the goldens' prompt_ids, decode(encode(x)) == x round trips, the BOS/EOS
// rules of tokenizer_config.json, the factory's choice by model-dir files, refused files (each
// error names the file / key), refused invalid UTF-8 input (error names the byte offset), and
// FirstInvalidUtf8 itself.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/json.h"
#include "test_paths.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

using nibble_test::TempDir;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::unique_ptr<Tokenizer> LoadOrDie(const std::string& dir) {
  auto r = Tokenizer::Load(dir);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : nullptr;
}

// A temp model dir holding the prose-llama-7m tokenizer.model and the given tokenizer_config.json
// (none when empty).
void MakeDir(const TempDir& dir, const std::string& tokenizer_config) {
  fs::copy_file(nibble_test::EmbeddedModel() + "/tokenizer.model", dir.path() + "/tokenizer.model");
  if (!tokenizer_config.empty()) WriteFile(dir.path() + "/tokenizer_config.json", tokenizer_config);
}

void ExpectLoadError(const std::string& dir, const std::vector<std::string>& needles) {
  auto r = Tokenizer::Load(dir);
  ASSERT_FALSE(r.ok()) << "expected a load error";
  for (const auto& n : needles)
    EXPECT_NE(r.error().message.find(n), std::string::npos) << "missing \"" << n << "\" in: " << r.error().message;
}

// ---------------------------------------------------------------------------------------------
// Shipped tokenizers.

void CheckGoldenPrompt(const std::string& tokenizer_dir, const std::string& golden_model) {
  auto golden = ReadJsonFile(nibble_test::SharedModel(golden_model) + "/goldens/logits_once_upon_a_time.json");
  ASSERT_TRUE(golden.ok()) << golden.error().message;
  auto tok = LoadOrDie(tokenizer_dir);
  ASSERT_NE(tok, nullptr);
  const std::string prompt = (*golden)["prompt"].get<std::string>();
  ASSERT_EQ(prompt, "Once upon a time");
  auto ids = tok->Encode(prompt);
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_EQ(*ids, (*golden)["prompt_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(tok->Decode(*ids), prompt);
}

TEST(TokenizerShipped, ProseLlama7mEncodesGoldenPrompt) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m");
  CheckGoldenPrompt(nibble_test::EmbeddedModel(), "prose-llama-7m");
}

TEST(TokenizerShipped, Stories260KEncodesGoldenPrompt) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  CheckGoldenPrompt(nibble_test::SharedModel("stories260K"), "stories260K");
}

TEST(TokenizerShipped, SpecialIds) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  for (const std::string& dir : {nibble_test::EmbeddedModel(), nibble_test::SharedModel("stories260K")}) {
    auto tok = LoadOrDie(dir);
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->bos_id(), 1) << dir;
    EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{2})) << dir;
    EXPECT_TRUE(tok->add_bos()) << dir;
    EXPECT_GT(tok->vocab_size(), 2) << dir;
  }
}

TEST(TokenizerShipped, DecodeEncodeRoundTrips) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      "Hello",
      "a  b   c    d",                 // runs of spaces
      "tab\there\t\tand\nnewlines\n\n", // tabs, newlines
      "   leading and trailing   ",
      "0123456789 3.14159 1,000,000 42",
      "caf\xC3\xA9 na\xC3\xAFve \xC3\xA9t\xC3\xA9",          // é, ï
      "\xE6\x97\xA5\xE6\x9C\xAC",                            // 日本
      "emoji \xF0\x9F\x98\x80 and \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",  // 😀 👍🏽
      "mixed: caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 123 \xF0\x9F\x98\x80!",
  };
  for (const std::string& dir : {nibble_test::EmbeddedModel(), nibble_test::SharedModel("stories260K")}) {
    auto tok = LoadOrDie(dir);
    ASSERT_NE(tok, nullptr);
    for (const auto& text : texts) {
      auto ids = tok->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.error().message;
      ASSERT_FALSE(ids->empty());
      EXPECT_EQ((*ids)[0], tok->bos_id()) << text;
      EXPECT_EQ(tok->Decode(*ids), text) << dir << ": " << text;
    }
  }
}

TEST(TokenizerShipped, EmptyTextIsJustBos) {
  auto tok = LoadOrDie(nibble_test::EmbeddedModel());
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("");
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_EQ(*ids, (std::vector<int32_t>{tok->bos_id()}));
  EXPECT_EQ(tok->Decode(*ids), "");
}

// ---------------------------------------------------------------------------------------------
// BOS / EOS rules.

TEST(TokenizerSpecial, AddBosFalseGivesNoBos) {
  auto with = LoadOrDie(nibble_test::EmbeddedModel());
  ASSERT_NE(with, nullptr);
  TempDir dir;
  MakeDir(dir, R"({"add_bos_token": false, "add_eos_token": false})");
  auto without = LoadOrDie(dir.path());
  ASSERT_NE(without, nullptr);
  EXPECT_FALSE(without->add_bos());
  auto a = with->Encode("Once upon a time");
  auto b = without->Encode("Once upon a time");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size() + 1);
  EXPECT_EQ((*a)[0], with->bos_id());
  EXPECT_NE((*b)[0], with->bos_id());
  EXPECT_EQ(std::vector<int32_t>(a->begin() + 1, a->end()), *b);
}

TEST(TokenizerSpecial, AddEosTrueAppendsEos) {
  TempDir dir;
  MakeDir(dir, R"({"add_bos_token": true, "add_eos_token": true})");
  auto tok = LoadOrDie(dir.path());
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("Once upon a time");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ(ids->back(), 2);
  EXPECT_EQ(tok->Decode(*ids), "Once upon a time");
}

TEST(TokenizerSpecial, NoTokenizerConfigDefaultsToBos) {
  TempDir dir;
  MakeDir(dir, "");
  auto tok = LoadOrDie(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 1);
}

TEST(TokenizerSpecial, ConfigJsonOverridesEosIds) {
  TempDir dir;
  MakeDir(dir, "");
  WriteFile(dir.path() + "/config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 5]})");
  auto tok = LoadOrDie(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{2, 5}));
}

TEST(TokenizerSpecial, EncodeWithoutSpecialTokens) {
  TempDir dir;
  MakeDir(dir, R"({"add_bos_token": true, "add_eos_token": true})");
  auto tok = LoadOrDie(dir.path());
  ASSERT_NE(tok, nullptr);
  auto with = tok->Encode("Once upon a time");
  auto without = tok->Encode("Once upon a time", /*add_special_tokens=*/false);
  ASSERT_TRUE(with.ok() && without.ok());
  ASSERT_EQ(with->size(), without->size() + 2);
  EXPECT_EQ(std::vector<int32_t>(with->begin() + 1, with->end() - 1), *without);
  for (int32_t id : *without) EXPECT_FALSE(tok->IsSpecial(id)) << id;
}

TEST(TokenizerSpecial, IsSpecial) {
  auto tok = LoadOrDie(nibble_test::EmbeddedModel());
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->IsSpecial(tok->bos_id()));
  EXPECT_TRUE(tok->IsSpecial(tok->eos_ids()[0]));
  auto ids = tok->Encode("Once", false);
  ASSERT_TRUE(ids.ok() && !ids->empty());
  EXPECT_FALSE(tok->IsSpecial((*ids)[0]));
  EXPECT_FALSE(tok->IsSpecial(-1));
  EXPECT_FALSE(tok->IsSpecial(tok->vocab_size()));
}

// ---------------------------------------------------------------------------------------------
// The factory picks the implementation from the files of the model directory.

bool IsSentencePiece(const Tokenizer* tok) { return dynamic_cast<const SentencePieceTokenizer*>(tok) != nullptr; }

TEST(TokenizerFactory, TokenizerModelGivesSentencePiece) {
  auto tok = LoadOrDie(nibble_test::EmbeddedModel());
  EXPECT_TRUE(IsSentencePiece(tok.get()));
}

TEST(TokenizerFactory, TokenizerModelWinsOverTokenizerJson) {
  TempDir dir;
  MakeDir(dir, "");
  WriteFile(dir.path() + "/tokenizer.json", "not json at all");
  auto tok = LoadOrDie(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(IsSentencePiece(tok.get()));
  auto ids = tok->Encode("Once upon a time");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(tok->Decode(*ids), "Once upon a time");
}

TEST(TokenizerFactory, OnlyTokenizerJsonIsReadAsTokenizerJson) {
  TempDir dir;
  WriteFile(dir.path() + "/tokenizer.json", "{}");
  WriteFile(dir.path() + "/tokenizer_config.json", "{}");
  ExpectLoadError(dir.path(), {dir.path() + "/tokenizer.json", "no \"model\""});
}

TEST(TokenizerFactory, NeitherFileNamesBoth) {
  TempDir dir;
  WriteFile(dir.path() + "/tokenizer_config.json", "{}");
  ExpectLoadError(dir.path(), {dir.path(), "no tokenizer.model", "tokenizer.json"});
}

TEST(TokenizerFactory, MissingDirectory) {
  ExpectLoadError("/nonexistent/model", {"/nonexistent/model", "no tokenizer.model", "tokenizer.json"});
}

// ---------------------------------------------------------------------------------------------
// Refused files.

TEST(TokenizerErrors, NotASentencePieceModelRandomBytes) {
  TempDir dir;
  std::string bytes;
  uint32_t x = 12345;
  for (int i = 0; i < 4096; ++i) {
    x = x * 1664525u + 1013904223u;
    bytes.push_back(static_cast<char>(x >> 24));
  }
  WriteFile(dir.path() + "/tokenizer.model", bytes);
  ExpectLoadError(dir.path(), {dir.path() + "/tokenizer.model", "not a SentencePiece model"});
}

TEST(TokenizerErrors, NotASentencePieceModelEmptyFile) {
  TempDir dir;
  WriteFile(dir.path() + "/tokenizer.model", "");
  ExpectLoadError(dir.path(), {dir.path() + "/tokenizer.model", "not a SentencePiece model"});
}

TEST(TokenizerErrors, NotASentencePieceModelJson) {
  TempDir dir;
  WriteFile(dir.path() + "/tokenizer.model", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})");
  ExpectLoadError(dir.path(), {dir.path() + "/tokenizer.model", "not a SentencePiece model"});
}

TEST(TokenizerErrors, MissingTokenizerModel) {
  TempDir dir;
  ExpectLoadError(dir.path(), {dir.path(), "no tokenizer.model"});
}

TEST(TokenizerErrors, OnlyTokenizerJsonNotJson) {
  TempDir dir;
  WriteFile(dir.path() + "/tokenizer.json", "{\"model\": ");
  ExpectLoadError(dir.path(), {dir.path() + "/tokenizer.json"});
}

TEST(TokenizerErrors, AddBosTokenAsString) {
  TempDir dir;
  MakeDir(dir, R"({"add_bos_token": "true"})");
  ExpectLoadError(dir.path(), {"tokenizer_config.json", "key \"add_bos_token\"", "expected true or false", "\"true\""});
}

TEST(TokenizerErrors, AddEosTokenAsNumber) {
  TempDir dir;
  MakeDir(dir, R"({"add_eos_token": 1})");
  ExpectLoadError(dir.path(), {"tokenizer_config.json", "key \"add_eos_token\""});
}

TEST(TokenizerErrors, MalformedTokenizerConfig) {
  TempDir dir;
  MakeDir(dir, R"({"add_bos_token": tru)");
  ExpectLoadError(dir.path(), {"tokenizer_config.json"});
}

TEST(TokenizerErrors, EosOutOfVocabInConfigJson) {
  TempDir dir;
  MakeDir(dir, "");
  WriteFile(dir.path() + "/config.json", R"({"eos_token_id": 1000000})");
  ExpectLoadError(dir.path(), {"config.json", "key \"eos_token_id\"", "1000000"});
}

// ---------------------------------------------------------------------------------------------
// Invalid UTF-8 input is refused with the byte offset.

void ExpectEncodeError(const std::string& text, int64_t offset) {
  static auto tok = LoadOrDie(nibble_test::EmbeddedModel());
  ASSERT_NE(tok, nullptr);
  auto r = tok->Encode(text);
  ASSERT_FALSE(r.ok()) << "expected an error for offset " << offset;
  const std::string needle = "offset " + std::to_string(offset) + ")";
  EXPECT_NE(r.error().message.find("not valid UTF-8"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << "missing \"" << needle << "\" in: " << r.error().message;
}

TEST(TokenizerUtf8, LoneFF) { ExpectEncodeError("ab\xff" "cd", 2); }
TEST(TokenizerUtf8, Truncated3Byte) { ExpectEncodeError("x\xE6\x97", 1); }
TEST(TokenizerUtf8, Truncated3ByteFollowedByAscii) { ExpectEncodeError("abc\xE6\x97z", 3); }
TEST(TokenizerUtf8, Overlong2Byte) { ExpectEncodeError(std::string("abc\xC0\x80", 5), 3); }
TEST(TokenizerUtf8, Surrogate) { ExpectEncodeError("ok \xED\xA0\x80", 3); }
TEST(TokenizerUtf8, AfterValidMultibyte) { ExpectEncodeError("\xC3\xA9\xE6\x97\xA5\x80", 5); }

// ---------------------------------------------------------------------------------------------
// FirstInvalidUtf8.

TEST(FirstInvalidUtf8, ValidStrings) {
  EXPECT_EQ(FirstInvalidUtf8(""), -1);
  EXPECT_EQ(FirstInvalidUtf8("plain ASCII ~\x7f"), -1);
  EXPECT_EQ(FirstInvalidUtf8(std::string("nul\0inside", 10)), -1);
  EXPECT_EQ(FirstInvalidUtf8("\xC2\x80"), -1);          // U+0080, smallest 2-byte
  EXPECT_EQ(FirstInvalidUtf8("\xDF\xBF"), -1);          // U+07FF
  EXPECT_EQ(FirstInvalidUtf8("\xE0\xA0\x80"), -1);      // U+0800, smallest 3-byte
  EXPECT_EQ(FirstInvalidUtf8("\xED\x9F\xBF"), -1);      // U+D7FF, just below surrogates
  EXPECT_EQ(FirstInvalidUtf8("\xEE\x80\x80"), -1);      // U+E000, just above surrogates
  EXPECT_EQ(FirstInvalidUtf8("\xEF\xBF\xBF"), -1);      // U+FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xF0\x90\x80\x80"), -1);  // U+10000, smallest 4-byte
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x8F\xBF\xBF"), -1);  // U+10FFFF, largest
  EXPECT_EQ(FirstInvalidUtf8("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80"), -1);
}

TEST(FirstInvalidUtf8, InvalidLeadBytes) {
  EXPECT_EQ(FirstInvalidUtf8("\xff"), 0);
  EXPECT_EQ(FirstInvalidUtf8("a\xfe"), 1);
  EXPECT_EQ(FirstInvalidUtf8("ab\xf8\x88\x80\x80\x80"), 2);  // 5-byte form
  EXPECT_EQ(FirstInvalidUtf8("\x80"), 0);                   // lone continuation
  EXPECT_EQ(FirstInvalidUtf8("abc\xBF"), 3);
}

TEST(FirstInvalidUtf8, Truncated) {
  EXPECT_EQ(FirstInvalidUtf8("\xC3"), 0);
  EXPECT_EQ(FirstInvalidUtf8("x\xE6\x97"), 1);
  EXPECT_EQ(FirstInvalidUtf8("xy\xF0\x9F\x98"), 2);
  EXPECT_EQ(FirstInvalidUtf8("\xC3" "A"), 0);  // continuation replaced by ASCII
  EXPECT_EQ(FirstInvalidUtf8("\xE6\x97" "A"), 0);
}

TEST(FirstInvalidUtf8, Overlong) {
  EXPECT_EQ(FirstInvalidUtf8(std::string("\xC0\x80", 2)), 0);
  EXPECT_EQ(FirstInvalidUtf8("\xC1\xBF"), 0);
  EXPECT_EQ(FirstInvalidUtf8("a\xE0\x80\x80"), 1);
  EXPECT_EQ(FirstInvalidUtf8("a\xE0\x9F\xBF"), 1);      // U+07FF in 3 bytes
  EXPECT_EQ(FirstInvalidUtf8("ab\xF0\x80\x80\x80"), 2);
  EXPECT_EQ(FirstInvalidUtf8("ab\xF0\x8F\xBF\xBF"), 2);  // U+FFFF in 4 bytes
}

TEST(FirstInvalidUtf8, SurrogatesAndBeyondUnicode) {
  EXPECT_EQ(FirstInvalidUtf8("\xED\xA0\x80"), 0);        // U+D800
  EXPECT_EQ(FirstInvalidUtf8("ok\xED\xBF\xBF"), 2);      // U+DFFF
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0);    // U+110000
  EXPECT_EQ(FirstInvalidUtf8("\xF5\x80\x80\x80"), 0);
  EXPECT_EQ(FirstInvalidUtf8("\xF7\xBF\xBF\xBF"), 0);
}

TEST(FirstInvalidUtf8, ReportsFirstOfSeveral) {
  EXPECT_EQ(FirstInvalidUtf8("\xC3\xA9ok\xff\xC0\x80"), 4);
}

}  // namespace
}  // namespace nibble
