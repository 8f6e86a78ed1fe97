// quantize checks what generate checks, up front: tensor shapes against config.json (quantize and
// inspect), an export in which nothing would be quantized, --dataset unused by RTN; and an export
// carries every non-weight file of its input.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "test_paths.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

// A copy of the embedded model whose config.json has `from` replaced by `to`.
std::string EditedCopy(const nibble_test::TempDir& tmp, const std::string& from, const std::string& to) {
  const std::string dir = tmp.sub("edited");
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(nibble_test::EmbeddedModel()))
    if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
  std::ifstream in(dir + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  fs::remove(dir + "/config.json");
  tmp.Write("edited/config.json", text);
  return dir;
}

TEST(QuantizeChecks, ShapesDisagreeingWithConfigAreRefusedByQuantizeAndInspect) {
  nibble_test::TempDir tmp;
  const std::string dir = EditedCopy(tmp, "\"hidden_size\": 256", "\"hidden_size\": 320");
  nibble::QuantizeRequest r;
  r.model_dir = dir;
  r.output_dir = tmp.sub("out");
  auto q = nibble::Quantize(r);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("config.json: hidden_size is 320 but model.embed_tokens.weight"), std::string::npos)
      << q.error().message;
  EXPECT_NE(q.error().message.find("has 256 columns (shape [4096, 256])"), std::string::npos) << q.error().message;
  EXPECT_EQ(q.error().code, nibble::ErrorCode::kCorruptInput);
  EXPECT_FALSE(fs::exists(r.output_dir));
  auto i = nibble::Inspect(dir);
  ASSERT_FALSE(i.ok());
  EXPECT_NE(i.error().message.find("config.json: hidden_size is 320"), std::string::npos) << i.error().message;
}

TEST(QuantizeChecks, AnExportWithNothingQuantizedIsAnError) {
  nibble_test::TempDir tmp;
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  r.group_size = 1000;
  r.misaligned = "exclude";
  auto q = nibble::Quantize(r);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("no linear layer would be quantized (43 kept in float"), std::string::npos)
      << q.error().message;
  EXPECT_NE(q.error().message.find("more rules"), std::string::npos) << q.error().message;
  EXPECT_FALSE(fs::exists(r.output_dir));
}

TEST(QuantizeChecks, EveryNonWeightFileIsCopiedAndDatasetWithRtnIsAWarning) {
  nibble_test::TempDir tmp;
  const std::string dir = EditedCopy(tmp, "\"model_type\"", "\"model_type\"");
  tmp.Write("edited/chat_template.jinja", "{{ messages }}");
  tmp.Write("edited/special_tokens_map.json", "{}");
  std::vector<std::string> messages;
  nibble::QuantizeRequest r;
  r.model_dir = dir;
  r.output_dir = tmp.sub("out");
  r.dataset = "calib.txt";
  r.on_message = [&](const std::string& m) { messages.push_back(m); };
  auto q = nibble::Quantize(r);
  ASSERT_TRUE(q.ok()) << q.error().message;
  for (const char* f : {"chat_template.jinja", "special_tokens_map.json", "tokenizer.model", "tokenizer_config.json",
                        "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(r.output_dir + "/" + f)) << f;
    EXPECT_NE(std::find(q->copied_files.begin(), q->copied_files.end(), f), q->copied_files.end()) << f;
  }
  EXPECT_EQ(std::find(q->copied_files.begin(), q->copied_files.end(), "model.safetensors"), q->copied_files.end());
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_NE(messages[0].find("--dataset calib.txt is not used by --quant_algo rtn"), std::string::npos) << messages[0];
}

}  // namespace
