// Implausible config.json sizes (a typo or a hostile file) against every command that reads a
// model: each run under a small address-space limit must end within seconds with an error naming
// the key, never a std::bad_alloc abort (134), a signal or minutes of work. Sizes the checkpoint
// does not bound (max_position_embeddings) must not size anything beyond the context in use.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::Quote;
using nibble_test::RunCommand;
using nibble_test::RunResult;

// The address space each run may map: the embedded model's commands need far less; a table sized
// by an absurd config value does not fit it, so an unchecked allocation fails fast here.
constexpr long kAddressSpaceKiB = 2L * 1024 * 1024;

class ConfigLimits : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::temp_directory_path() / ("nibble_config_limits_" + std::to_string(::getpid()))).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    std::ofstream(root_ + "/text.txt") << std::string(200, 'a') + " " +
                                              [] {
                                                std::string s;
                                                for (int i = 0; i < 60; ++i) s += "And God said, let there be light. ";
                                                return s;
                                              }();
    quark_ = root_ + "/quark";
    const RunResult q = nibble_test::RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) +
                                               " --output_dir " + Quote(quark_) + " --threads 1");
    ASSERT_EQ(q.exit_code, 0) << q.out;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // A copy of `base` (files linked) whose config.json has `edit` applied.
  static std::string Variant(const std::string& base, const std::string& tag, const nlohmann::json& edit) {
    const std::string dir = root_ + "/" + tag;
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(base))
      if (e.is_regular_file() && e.path().filename() != "config.json")
        fs::create_symlink(fs::absolute(e.path()), dir + "/" + e.path().filename().string());
    nlohmann::json config = nlohmann::json::parse(nibble_test::ReadFile(base + "/config.json"));
    config.merge_patch(edit);
    std::ofstream(dir + "/config.json") << config.dump(2);
    return dir;
  }

  // `nibble args` under the address-space limit, timed.
  static RunResult RunLimited(const std::string& args, double* seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = RunCommand("(ulimit -v " + std::to_string(kAddressSpaceKiB) + " && exec " +
                             Quote(nibble_test::NibbleBinary()) + " " + args + ") 2>&1");
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  // Every command that reads a model, on `dense` (a float checkpoint) and `quant` (quantized).
  static std::vector<std::pair<std::string, std::string>> Commands(const std::string& dense, const std::string& quant) {
    const std::string out = Quote(root_ + "/out"), text = Quote(root_ + "/text.txt");
    const std::string d = Quote(dense), q = Quote(quant);
    return {
        {"generate", "generate --model " + d + " --prompt hi -n 2 --seed 1 --threads 1"},
        {"generate (quantized)", "generate --model " + q + " --prompt hi -n 2 --seed 1 --threads 1"},
        {"perplexity", "perplexity --model " + d + " --text " + text + " --seq_len 64 --max_windows 1 --threads 1"},
        {"quantize", "quantize --model_dir " + d + " --output_dir " + out + " --overwrite --threads 1"},
        {"convert", "convert --in " + q + " --out " + out + " --to compressed-tensors --overwrite"},
        {"verify", "verify " + d + " " + Quote(nibble_test::EmbeddedModel())},
        {"inspect", "inspect " + q},
        {"export-onnx", "export-onnx --model " + q + " --out " + out + " --overwrite"},
        {"compare", "compare --model " + d + " --quantized " + q + " --text " + text +
                        " --seq_len 64 --max_windows 1 --threads 1"},
        {"tokenize", "tokenize --model " + d + " --text hi"},
        {"bench-model", "bench-model -m " + d + " -p 8 -n 2 -r 1 -t 1"},
    };
  }

  static std::string root_, quark_;
};
std::string ConfigLimits::root_, ConfigLimits::quark_;

struct Implausible {
  const char* tag;
  nlohmann::json edit;
  const char* expect;  // in the error of every command that reads config.json's sizes
};

TEST_F(ConfigLimits, EveryCommandNamesTheKeyQuicklyWithoutAborting) {
#ifdef NIBBLE_TEST_ASAN
  GTEST_SKIP() << "ASan reserves more address space than the limit these runs use";
#endif
  const Implausible cases[] = {
      {"layers", {{"num_hidden_layers", 100000}},
       "num_hidden_layers is 100000 but the checkpoint has tensors for 6 layers (model.layers.0 .. model.layers.5)"},
      {"layers-max", {{"num_hidden_layers", 2147483647}}, "num_hidden_layers is 2147483647"},
      {"vocab", {{"vocab_size", 2000000000}}, "vocab_size is 2000000000 but model.embed_tokens.weight"},
      {"hidden", {{"hidden_size", 1000000000}}, "hidden_size is 1000000000 but model.embed_tokens.weight"},
      {"intermediate", {{"intermediate_size", 1000000000}}, "intermediate_size 1000000000"},
      {"heads", {{"num_attention_heads", 1 << 20}, {"num_key_value_heads", 1 << 20}}, "num_attention_heads 1048576"},
      {"head_dim", {{"head_dim", 1 << 30}}, "head_dim 1073741824"},
      {"overflow", {{"num_hidden_layers", 9223372036854775807LL}},
       "\"num_hidden_layers\": expected a positive integer up to 2147483647"},
  };
  for (const Implausible& c : cases) {
    const std::string dense = Variant(nibble_test::EmbeddedModel(), std::string("dense-") + c.tag, c.edit);
    const std::string quant = Variant(quark_, std::string("quark-") + c.tag, c.edit);
    for (const auto& [name, args] : Commands(dense, quant)) {
      double seconds = 0;
      const RunResult r = RunLimited(args, &seconds);
      const std::string what = std::string(c.tag) + " / " + name + ": ";
      EXPECT_LT(seconds, 3.0) << what << r.out;
      if (name == "tokenize") {  // reads the tokenizer files only
        EXPECT_EQ(r.exit_code, 0) << what << r.out;
        continue;
      }
      EXPECT_EQ(r.exit_code, name == "verify" ? 2 : 1) << what << r.out;  // verify: 2 = a read error
      EXPECT_NE(r.out.find("nibble: error: "), std::string::npos) << what << r.out;
      EXPECT_NE(r.out.find(c.expect), std::string::npos) << what << r.out;
      EXPECT_NE(r.out.find("config.json"), std::string::npos) << what << r.out;
    }
  }
}

// max_position_embeddings has no tensor to check against: every table is sized by the context a
// command uses (a generation's prompt + -n, a perplexity window), so the largest value runs; only
// what must cover every position (export-onnx's rotary caches) is refused, naming the key.
TEST_F(ConfigLimits, LargestContextRunsWithTablesSizedByTheContextInUse) {
#ifdef NIBBLE_TEST_ASAN
  GTEST_SKIP() << "ASan reserves more address space than the limit these runs use";
#endif
  const nlohmann::json edit = {{"max_position_embeddings", 2147483647}};
  const std::string dense = Variant(nibble_test::EmbeddedModel(), "dense-maxpos", edit);
  const std::string quant = Variant(quark_, "quark-maxpos", edit);
  for (const auto& [name, args] : Commands(dense, quant)) {
    double seconds = 0;
    const RunResult r = RunLimited(args, &seconds);
    const std::string what = name + ": ";
    EXPECT_LT(seconds, 3.0) << what << r.out;
    if (name == "export-onnx") {
      EXPECT_EQ(r.exit_code, 1) << what << r.out;
      EXPECT_NE(r.out.find("the rotary cos/sin caches of max_position_embeddings 2147483647"), std::string::npos)
          << what << r.out;
      EXPECT_NE(r.out.find("of memory available"), std::string::npos) << what << r.out;
    } else {  // verify: the two checkpoints differ in config.json only, so they hold the same model
      EXPECT_EQ(r.exit_code, 0) << what << r.out;
    }
  }
}

// A chat over the largest declared context runs in the default bounded context (8192 positions,
// not max_position_embeddings); asking for the whole declared context is a named error, not an abort.
TEST_F(ConfigLimits, ChatOverTheLargestContextIsAMemoryErrorNamingThePositions) {
#ifdef NIBBLE_TEST_ASAN
  GTEST_SKIP() << "ASan reserves more address space than the limit these runs use";
#endif
  const std::string dense = Variant(nibble_test::EmbeddedModel(), "dense-chat", {{"max_position_embeddings", 2147483647}});
  const std::string tmpl = root_ + "/chat.jinja";
  std::ofstream(tmpl) << "{% for m in messages %}{{ m['content'] }}{% endfor %}";
  const std::string chat = "generate --model " + Quote(dense) + " --chat --chat_template " + Quote(tmpl) + " -n 2";
  double seconds = 0;
  RunResult r = RunLimited(chat + " < /dev/null", &seconds);
  EXPECT_LT(seconds, 3.0) << r.out;
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("KV cache: ctx 8192 "), std::string::npos) << r.out;
  r = RunLimited(chat + " --ctx_size 2147483647 < /dev/null", &seconds);
  EXPECT_LT(seconds, 3.0) << r.out;
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("a KV cache of 2147483647 positions"), std::string::npos) << r.out;
}

// synth makes a checkpoint from a config alone: its size is checked against the disk and memory
// before any tensor list or file is made.
TEST_F(ConfigLimits, SynthRefusesSizesThatCannotBeWritten) {
#ifdef NIBBLE_TEST_ASAN
  GTEST_SKIP() << "ASan reserves more address space than the limit these runs use";
#endif
  nlohmann::json config = nlohmann::json::parse(nibble_test::ReadFile(nibble_test::SourceDir() + "/bench/configs/llama3-tiny.json"));
  config["num_hidden_layers"] = 2147483647;
  const std::string path = root_ + "/synth-config.json";
  std::ofstream(path) << config.dump();
  double seconds = 0;
  const RunResult r = RunLimited("synth --config " + Quote(path) + " --out " + Quote(root_ + "/synth") + " --overwrite", &seconds);
  EXPECT_LT(seconds, 3.0) << r.out;
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("synth-config.json: these sizes make a bf16 checkpoint of "), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(root_ + "/synth"));
}

// A prompt longer than the context is refused before anything is echoed on stdout.
TEST(GeneratePrompt, TooLongPromptIsRefusedBeforeTheEcho) {
  const std::string args = "generate --model " + Quote(nibble_test::EmbeddedModel()) + " -n 1 --prompt " +
                           Quote(std::string(6000, 'x'));
  const RunResult out_only = nibble_test::RunNibble(args, /*merge_stderr=*/false);
  EXPECT_EQ(out_only.exit_code, 1);
  EXPECT_EQ(out_only.out, "");
  const RunResult both = nibble_test::RunNibble(args);
  EXPECT_NE(both.out.find("nibble: error: prompt is "), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("longer than max_position_embeddings (512)"), std::string::npos) << both.out;
}

// perplexity / compare: a window longer than the context is refused before a KV cache is sized for
// it; an empty or too short text says how many tokens it has.
TEST(PerplexityWindow, BeyondTheContextAndTooShortTextsAreNamed) {
  const std::string model = Quote(nibble_test::EmbeddedModel());
  nibble_test::TempDir tmp;
  const std::string empty = tmp.sub("empty.txt"), few = tmp.sub("few.txt");
  { std::ofstream(empty) << ""; }
  { std::ofstream(few) << "Once upon a time"; }
  for (const std::string& cmd : {"perplexity --model " + model, "compare --model " + model + " -q " + model}) {
    const RunResult big = nibble_test::RunNibble(cmd + " --text " + Quote(few) + " --seq_len 100000");
    EXPECT_EQ(big.exit_code, 1) << big.out;
    EXPECT_NE(big.out.find("--seq_len 100000 exceeds the model's max_position_embeddings (512)"), std::string::npos) << big.out;
    EXPECT_EQ(big.out.find("KV cache: ctx 100000"), std::string::npos) << big.out;
    const RunResult none = nibble_test::RunNibble(cmd + " --text " + Quote(empty));
    EXPECT_EQ(none.exit_code, 1) << none.out;
    EXPECT_NE(none.out.find("nothing to score"), std::string::npos) << none.out;
    const RunResult short_text = nibble_test::RunNibble(cmd + " --text " + Quote(few) + " --seq_len 64");
    EXPECT_EQ(short_text.exit_code, 1) << short_text.out;
    EXPECT_NE(short_text.out.find("tokens, fewer than one window of --seq_len 64"), std::string::npos) << short_text.out;
  }
}

}  // namespace
