// Model::special_tokens: BOS / EOS / pad ids from config.json over the tokenizer's own, and a
// pad_token_id outside the vocabulary refused naming the key.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "api/load_or_fail.h"
#include "test_util.h"

namespace {

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A copy of the embedded model whose config.json has `key` set to `value`.
std::string ModelWithConfigKey(const nibble_test::TempDir& dir, const std::string& key, const nlohmann::json& value) {
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(nibble_test::EmbeddedModel()))
    if (e.is_regular_file()) fs::copy_file(e.path(), fs::path(dir.path()) / e.path().filename());
  auto cfg = nlohmann::json::parse(ReadText(dir.path() + "/config.json"));
  cfg[key] = value;
  std::ofstream(dir.path() + "/config.json") << cfg.dump(2);
  return dir.path();
}

TEST(SpecialTokens, IdsComeFromConfigJson) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  const auto cfg = nlohmann::json::parse(ReadText(nibble_test::EmbeddedModel() + "/config.json"));
  const nibble::SpecialTokenIds st = model->special_tokens();
  EXPECT_EQ(st.bos_id, cfg.at("bos_token_id").get<int32_t>());
  EXPECT_EQ(st.eos_ids, std::vector<int32_t>{cfg.at("eos_token_id").get<int32_t>()});
  EXPECT_TRUE(st.add_bos);
  EXPECT_FALSE(st.add_eos);
  // Tokenize prepends exactly bos_id.
  auto ids = model->Tokenize("Once upon a time");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), st.bos_id);

  nibble_test::TempDir dir("nibble_pad_");
  auto padded = nibble_test::LoadOrFail(ModelWithConfigKey(dir, "pad_token_id", 3));
  ASSERT_NE(padded, nullptr);
  EXPECT_EQ(padded->special_tokens().pad_id, 3);
}

TEST(SpecialTokens, APadIdOutsideTheVocabularyIsRefusedNamingTheKey) {
  nibble_test::TempDir dir("nibble_bad_pad_");
  auto m = nibble::Model::Load(ModelWithConfigKey(dir, "pad_token_id", 1 << 20));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("config.json: key \"pad_token_id\": expected a token id in [0, 4096), found 1048576"),
            std::string::npos)
      << m.error().message;
}

// Tokenize without special tokens is the text's own ids: the default call's without its BOS, and
// the tokenizer file's own encoding of the text (TextTokenizer, read independently of the model).
TEST(SpecialTokens, TokenizeWithoutSpecialTokensDropsOnlyTheBos) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  const std::string text = "Once upon a time, a small dog";
  auto with = model->Tokenize(text);
  auto without = model->Tokenize(text, /*add_special_tokens=*/false);
  ASSERT_TRUE(with.ok() && without.ok());
  ASSERT_TRUE(model->special_tokens().add_bos);
  ASSERT_EQ(with->size(), without->size() + 1);
  EXPECT_EQ(with->front(), model->special_tokens().bos_id);
  EXPECT_EQ(std::vector<int32_t>(with->begin() + 1, with->end()), *without);
  auto tok = nibble::TextTokenizer::Load(nibble_test::EmbeddedModel());
  ASSERT_TRUE(tok.ok());
  auto plain = (*tok)->Encode(text, false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, *without);
}

}  // namespace
