// config.json parsing (model/config.h): one test per class of bad config, each asserting the
// message names the file and the specific problem, then the accepted variants and defaults.
#include "model/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace nibble {
namespace {

using nlohmann::json;

constexpr char kPath[] = "some/dir/config.json";

// A valid small Llama config every case deviates from.
json Base() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", 64},
              {"intermediate_size", 172},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"vocab_size", 512},
              {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"hidden_act", "silu"},
              {"bos_token_id", 1},
              {"eos_token_id", 2}};
}

void ExpectError(const json& j, const std::string& needle) {
  auto r = ParseModelConfig(j, kPath);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << "got: " << r.error().message;
  EXPECT_NE(r.error().message.find(kPath), std::string::npos) << "error should name the file: " << r.error().message;
}

ModelConfig ExpectOk(const json& j) {
  auto r = ParseModelConfig(j, kPath);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : ModelConfig{};
}

TEST(ModelConfigErrors, BaselineParses) {
  const ModelConfig c = ExpectOk(Base());
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
}

TEST(ModelConfigErrors, MissingHiddenSize) {
  json j = Base();
  j.erase("hidden_size");
  ExpectError(j, "missing required key \"hidden_size\"");
}

TEST(ModelConfigErrors, HiddenSizeAsString) {
  json j = Base();
  j["hidden_size"] = "64";
  ExpectError(j, "key \"hidden_size\": expected a positive integer, found \"64\"");
}

TEST(ModelConfigErrors, HiddenSizeAsFloat) {
  json j = Base();
  j["hidden_size"] = 64.5;
  ExpectError(j, "key \"hidden_size\": expected a positive integer, found 64.5");
}

TEST(ModelConfigErrors, ZeroIntermediateSize) {
  json j = Base();
  j["intermediate_size"] = 0;
  ExpectError(j, "key \"intermediate_size\": expected a positive integer, found 0");
}

TEST(ModelConfigErrors, NegativeIntermediateSize) {
  json j = Base();
  j["intermediate_size"] = -172;
  ExpectError(j, "key \"intermediate_size\": expected a positive integer, found -172");
}

TEST(ModelConfigErrors, SizesAboveTheInt32RangeAreRefusedByKey) {
  for (const char* key : {"num_hidden_layers", "vocab_size", "max_position_embeddings", "hidden_size"}) {
    json j = Base();
    j[key] = 2147483648LL;
    ExpectError(j, std::string("key \"") + key + "\": expected a positive integer up to 2147483647, found 2147483648");
    j[key] = 18446744073709551615ULL;
    ExpectError(j, std::string("key \"") + key + "\": expected a positive integer up to 2147483647");
  }
  json j = Base();
  j["max_position_embeddings"] = 2147483647;
  ASSERT_TRUE(ParseModelConfig(j, kPath).ok());
}

TEST(ModelConfigErrors, HeadsNotDivisibleByKvHeads) {
  json j = Base();
  j["num_key_value_heads"] = 3;
  ExpectError(j, "num_attention_heads (8) is not divisible by num_key_value_heads (3)");
}

TEST(ModelConfigErrors, HiddenNotDivisibleByHeadsWithoutHeadDim) {
  json j = Base();
  j["hidden_size"] = 60;
  ExpectError(j, "hidden_size (60) is not divisible by num_attention_heads (8) and no head_dim is given");
}

TEST(ModelConfigErrors, HiddenNotDivisibleByHeadsIsFineWithHeadDim) {
  json j = Base();
  j["hidden_size"] = 60;
  j["head_dim"] = 16;
  EXPECT_EQ(ExpectOk(j).head_dim, 16);
}

TEST(ModelConfigErrors, OddExplicitHeadDim) {
  json j = Base();
  j["head_dim"] = 7;
  ExpectError(j, "head_dim 7 must be even");
}

TEST(ModelConfigErrors, OddDerivedHeadDim) {
  json j = Base();
  j["hidden_size"] = 72;  // 72 / 8 = 9
  ExpectError(j, "head_dim 9 must be even");
}

TEST(ModelConfigErrors, UnsupportedModelType) {
  json j = Base();
  j["model_type"] = "gpt2";
  ExpectError(j, "model_type \"gpt2\" is not supported");
}

TEST(ModelConfigErrors, MissingModelType) {
  json j = Base();
  j.erase("model_type");
  ExpectError(j, "key \"model_type\"");
}

TEST(ModelConfigErrors, UnsupportedArchitecture) {
  json j = Base();
  j["architectures"] = {"GPT2LMHeadModel"};
  ExpectError(j, "architecture \"GPT2LMHeadModel\" is not supported");
}

TEST(ModelConfigErrors, RopeScalingYarn) {
  json j = Base();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  ExpectError(j, "unsupported rope type \"yarn\"");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectError(j, "unsupported rope type \"yarn\"");
}

TEST(ModelConfigErrors, Llama3HighNotAboveLow) {
  json j = Base();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  ExpectError(j, "high_freq_factor (4.000000) must be larger than low_freq_factor (4.000000)");
}

TEST(ModelConfigErrors, HiddenActGelu) {
  json j = Base();
  j["hidden_act"] = "gelu";
  ExpectError(j, "key \"hidden_act\": expected \"silu\", found \"gelu\"");
}

TEST(ModelConfigErrors, EosOutOfVocab) {
  json j = Base();
  j["eos_token_id"] = 512;  // vocab_size 512
  ExpectError(j, "key \"eos_token_id\": expected a token id (or list of ids) in [0, vocab_size), found 512");
}

TEST(ModelConfigErrors, EosListWithOneOutOfVocab) {
  json j = Base();
  j["eos_token_id"] = {2, 600};
  ExpectError(j, "key \"eos_token_id\": expected a token id (or list of ids) in [0, vocab_size), found [2,600]");
}

TEST(ModelConfigErrors, NegativeEos) {
  json j = Base();
  j["eos_token_id"] = -1;
  ExpectError(j, "key \"eos_token_id\"");
}

TEST(ModelConfigErrors, BosList) {
  json j = Base();
  j["bos_token_id"] = {1, 2};
  ExpectError(j, "key \"bos_token_id\": expected a token id in [0, vocab_size), found [1,2]");
}

TEST(ModelConfigErrors, AttentionBiasAsString) {
  json j = Base();
  j["attention_bias"] = "true";
  ExpectError(j, "key \"attention_bias\": expected true or false, found \"true\"");
}

TEST(ModelConfigErrors, NotAnObject) {
  ExpectError(json::array({1, 2}), "expected a JSON object, found array");
}

TEST(ModelConfigErrors, LoadFromDirWithoutConfig) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "nibble_cfg_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  auto r = LoadModelConfig(tmpl);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no config.json"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(tmpl), std::string::npos) << r.error().message;
  std::filesystem::remove_all(tmpl);
}

TEST(ModelConfigErrors, MissingDirectoryAndFileInsteadOfDirectoryAreNamed) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "nibble_cfg_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  auto r = LoadModelConfig(tmpl + "/absent");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(tmpl + "/absent: model directory does not exist"), std::string::npos) << r.error().message;
  const std::string file = tmpl + "/config.json";
  std::ofstream(file) << "{}";
  r = LoadModelConfig(file);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(file + ": is not a directory"), std::string::npos) << r.error().message;
  std::filesystem::remove_all(tmpl);
}

// ---------------------------------------------------------------------------------------------
// Accepted configs.

TEST(ModelConfig, EosList) {
  json j = Base();
  j["eos_token_id"] = {2, 7, 511};
  EXPECT_EQ(ExpectOk(j).eos_token_ids, (std::vector<int64_t>{2, 7, 511}));
}

TEST(ModelConfig, EosScalarAndAbsent) {
  EXPECT_EQ(ExpectOk(Base()).eos_token_ids, (std::vector<int64_t>{2}));
  json j = Base();
  j.erase("eos_token_id");
  j.erase("bos_token_id");
  const ModelConfig c = ExpectOk(j);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
}

TEST(ModelConfig, Qwen2HasQkvBiasButNoOBias) {
  json j = Base();
  j["model_type"] = "qwen2";
  j["architectures"] = {"Qwen2ForCausalLM"};
  ModelConfig c = ExpectOk(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  // Even a (non-HF) attention_bias true does not give Qwen2 an o bias.
  j["attention_bias"] = true;
  c = ExpectOk(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
}

TEST(ModelConfig, LlamaAttentionBiasGivesAllFour) {
  EXPECT_FALSE(ExpectOk(Base()).qkv_bias);
  EXPECT_FALSE(ExpectOk(Base()).o_bias);
  json j = Base();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  const ModelConfig c = ExpectOk(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.mlp_bias);
}

TEST(ModelConfig, Defaults) {
  json j = Base();
  for (const char* k : {"num_key_value_heads", "rms_norm_eps", "rope_theta", "max_position_embeddings", "hidden_act",
                        "architectures"})
    j.erase(k);
  const ModelConfig c = ExpectOk(j);
  EXPECT_EQ(c.num_key_value_heads, 8);  // = num_attention_heads
  EXPECT_EQ(c.head_dim, 8);             // hidden_size / num_attention_heads
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(ModelConfig, RopeScalingVariants) {
  json j = Base();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  ModelConfig c = ExpectOk(j);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  c = ExpectOk(j);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ExpectOk(j).rope_scaling.type, RopeScaling::Type::kNone);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(ExpectOk(j).rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ModelConfig, MistralSlidingWindow) {
  json j = Base();
  j["model_type"] = "mistral";
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4096;
  EXPECT_EQ(ExpectOk(j).sliding_window, 4096);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(ExpectOk(j).sliding_window, 0);
}

TEST(ModelConfig, Qwen3QkNormAndExplicitHeadDim) {
  json j = Base();
  j["model_type"] = "qwen3";
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 128;  // independent of hidden_size / num_attention_heads
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  const ModelConfig c = ExpectOk(j);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.qkv_bias);  // attention_bias false: no q/k/v bias, unlike qwen2
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.sliding_window, 0);
  j["model_type"] = "llama";
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_FALSE(ExpectOk(j).qk_norm);
}

TEST(ModelConfig, QwenPerLayerSlidingWindowRefusedByName) {
  for (const char* mt : {"qwen2", "qwen3"}) {
    json j = Base();
    j["model_type"] = mt;
    j.erase("architectures");
    j["sliding_window"] = 4096;
    EXPECT_EQ(ExpectOk(j).sliding_window, 0) << mt;  // use_sliding_window absent = false (HF default)
    j["use_sliding_window"] = true;
    auto r = ParseModelConfig(j, "cfg.json");
    ASSERT_FALSE(r.ok()) << mt;
    EXPECT_EQ(r.error().code, nibble::ErrorCode::kUnsupported);
    EXPECT_NE(r.error().message.find("use_sliding_window"), std::string::npos) << r.error().message;
    j["use_sliding_window"] = "yes";
    r = ParseModelConfig(j, "cfg.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("\"use_sliding_window\": expected true or false"), std::string::npos)
        << r.error().message;
  }
}

TEST(ModelConfig, LoadsConfigFromDir) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "nibble_cfg_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  json j = Base();
  j["tie_word_embeddings"] = true;
  std::ofstream(tmpl + "/config.json") << j.dump();
  auto r = LoadModelConfig(tmpl);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->tie_word_embeddings);
  EXPECT_EQ(r->architecture, "LlamaForCausalLM");
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace nibble
