// JSON reading tests (io/json.h): duplicate keys at every depth, errors that name the source.
#include "io/json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"

namespace nibble {
namespace {

using nibble_test::TempDir;

void ExpectError(const std::string& text, const std::string& needle) {
  auto r = ParseJsonText(text, "cfg.json");
  ASSERT_FALSE(r.ok()) << "parsed: " << text;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("cfg.json", 0), 0u) << "error should start with the source: " << r.error().message;
}

TEST(JsonTest, ParsesValidObject) {
  auto r = ParseJsonText(R"({"a": 1, "b": {"c": [1, 2, {"d": "x"}]}})", "cfg.json");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["a"].get<int>(), 1);
  EXPECT_EQ((*r)["b"]["c"][2]["d"].get<std::string>(), "x");
}

TEST(JsonTest, DuplicateKeyAtTopLevel) { ExpectError(R"({"a": 1, "b": 2, "a": 3})", "duplicate key \"a\""); }

TEST(JsonTest, DuplicateKeyNested) {
  ExpectError(R"({"x": {"k": 1, "k": 2}})", "duplicate key \"k\"");
  ExpectError(R"({"x": [{"k": 1}, {"j": 1, "j": 2}]})", "duplicate key \"j\"");
  ExpectError(R"([[{"m": {"n": 1, "n": 1}}]])", "duplicate key \"n\"");
}

TEST(JsonTest, DuplicateKeyAfterNestedObjectAtSameLevel) {
  // The top-level set of keys must survive the nested object between the two "a"s.
  ExpectError(R"({"a": {"b": 1, "c": 2}, "a": 3})", "duplicate key \"a\"");
}

TEST(JsonTest, DuplicateKeyWrittenWithEscapes) {
  // "\u0061" is "a": the comparison is on decoded keys.
  ExpectError(R"({"a": 1, "\u0061": 2})", "duplicate key \"a\"");
}

TEST(JsonTest, SameKeyInSiblingOrNestedObjectsIsNotADuplicate) {
  for (const char* text : {R"({"x": {"a": 1}, "y": {"a": 2}})", R"([{"a": 1}, {"a": 2}])", R"({"a": {"a": {"a": 1}}})",
                           R"({"a": {"b": 1}, "b": 2})", R"({"l": [{"k": 1}], "k": 2})"}) {
    auto r = ParseJsonText(text, "cfg.json");
    EXPECT_TRUE(r.ok()) << text << ": " << r.error().message;
  }
}

TEST(JsonTest, InvalidJsonNamesTheSource) {
  ExpectError(R"({"a": 1,})", "not valid JSON");
  ExpectError("", "not valid JSON");
  ExpectError(R"({"a": 1} trailing)", "not valid JSON");
  ExpectError("{\"a\": \"\xff\"}", "UTF-8");
  // The parser's excerpt of a damaged file keeps no raw bytes (a binary header shown on a terminal).
  auto r = ParseJsonText("\x89PNG\r\n", "model.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("\\x89"), std::string::npos) << r.error().message;
  for (const char ch : r.error().message) EXPECT_TRUE(ch >= 0x20 && ch < 0x7F) << r.error().message;
}

TEST(JsonTest, NestingDepthIsLimited) {
  // Moderate nesting parses; a pathological one is refused early instead of building a huge DOM.
  const int ok_depth = kMaxJsonDepth - 10;
  auto r = ParseJsonText(std::string(ok_depth, '[') + std::string(ok_depth, ']'), "cfg.json");
  EXPECT_TRUE(r.ok()) << r.error().message;
  std::string obj;
  for (int i = 0; i < ok_depth; ++i) obj += "{\"k\":";
  obj += '1';
  obj.append(static_cast<size_t>(ok_depth), '}');
  EXPECT_TRUE(ParseJsonText(obj, "cfg.json").ok());
  ExpectError(std::string(kMaxJsonDepth + 10, '[') + std::string(kMaxJsonDepth + 10, ']'), "nested deeper than");
  ExpectError(std::string(1000000, '['), "nested deeper than");  // also before noticing the truncation
}

TEST(JsonTest, ReadJsonFileInvalidNamesThePath) {
  TempDir dir;
  const std::string p = dir.Write("config.json", "{\"hidden_size\": 256,,}");
  auto r = ReadJsonFile(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(p), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("not valid JSON"), std::string::npos) << r.error().message;
}

TEST(JsonTest, ReadJsonFileDuplicateNamesThePath) {
  TempDir dir;
  const std::string p = dir.Write("config.json", R"({"vocab_size": 1, "vocab_size": 2})");
  auto r = ReadJsonFile(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(p), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("duplicate key \"vocab_size\""), std::string::npos) << r.error().message;
}

TEST(JsonTest, ReadJsonFileMissingNamesThePath) {
  TempDir dir;
  const std::string p = dir.path() + "/no_such_config.json";
  auto r = ReadJsonFile(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(p), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("cannot open"), std::string::npos) << r.error().message;
}

TEST(JsonTest, ReadJsonFileOnDirectoryIsAnError) {
  TempDir dir;
  auto r = ReadJsonFile(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("is a directory"), std::string::npos) << r.error().message;
}

TEST(JsonTest, ReadJsonFileValid) {
  TempDir dir;
  auto r = ReadJsonFile(dir.Write("c.json", R"({"rope_theta": 10000.0})"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["rope_theta"].get<double>(), 10000.0);
}

}  // namespace
}  // namespace nibble
