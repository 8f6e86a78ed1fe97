// nibble export-onnx run by a real ONNX Runtime (onnxruntime-node, CPU) against nibble itself.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "e2e/run_nibble.h"
#include "test_paths.h"

namespace nibble_test {
namespace {

namespace fs = std::filesystem;

// Where scripts/install_node_packages.sh installs onnxruntime-node (npm install --ignore-scripts).
std::string OrtNodeModules() { return SourceDir() + "/build/npm/node_modules"; }

// Greedy ids and the prefill's last logits from tests/reference/ort_decode.js.
nlohmann::json RunOrt(const std::string& dir, const std::vector<int32_t>& prompt, int steps, const std::string& dtype) {
  const std::string cmd = "NODE_PATH=" + Quote(OrtNodeModules()) + " node " +
                          Quote(SourceDir() + "/tests/reference/ort_decode.js") + " " + Quote(dir) + " " +
                          Quote(nlohmann::json(prompt).dump()) + " " + std::to_string(steps) + " 2 " + dtype + " 2>&1";
  RunResult r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // ONNX Runtime prints its own warnings ([W:onnxruntime...]) to stderr; none are expected.
  EXPECT_EQ(r.out.find("[W:onnxruntime"), std::string::npos) << r.out;
  return nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
}

// nibble's greedy ids and prefill logits for the same prompt, with fp32 activations: the
// numerics ONNX Runtime's MatMulNBits has at accuracy_level 0 / 1.
void RunNibbleGreedy(const std::string& dir, const std::vector<int32_t>& prompt, int steps, std::vector<int32_t>* ids,
                     std::vector<float>* prefill) {
  nibble::LoadOptions lo;
  lo.activations = nibble::ActivationType::kFp32;
  lo.kv_dtype = nibble::KvDtype::kFp32;  // as the export's fp32 past_key_values (bf16 KV rounds K and V)
  auto model = nibble::Model::Load(dir, lo);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto s = nibble::Session::Create(**model);
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_TRUE((*s)->Prefill(prompt).ok());
  *prefill = (*s)->logits();
  nibble::SamplingOptions greedy;
  greedy.temperature = 0;
  for (int i = 0; i < steps; ++i) {
    auto t = (*s)->Sample(greedy);
    ASSERT_TRUE(t.ok()) << t.error().message;
    ids->push_back(*t);
    if (i + 1 < steps) {
      ASSERT_TRUE((*s)->Step(*t).ok());
    }
  }
}

bool OrtAvailable(std::string* why) {
  if (RunCommand("command -v node >/dev/null 2>&1").exit_code != 0) *why = "node not found in PATH";
  else if (!fs::exists(OrtNodeModules() + "/onnxruntime-node"))
    *why = "onnxruntime-node not installed in " + OrtNodeModules() + " (scripts/install_node_packages.sh installs it with npm)";
  return why->empty();
}

// Quantizes the embedded model with `quantize_flags`, exports it with `export_flags`, and checks
// that ONNX Runtime's prefill logits are within `tol` of nibble's and its `steps` greedy ids equal.
void CheckAgainstNibble(const std::string& quantize_flags, const std::string& export_flags, const std::string& dtype,
                        int steps, double tol) {
  const fs::path tmp = fs::temp_directory_path() / ("nibble_onnx_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string q = (tmp / "q").string(), onnx = (tmp / "onnx").string();
  RunResult r = RunNibble("quantize --model_dir " + Quote(EmbeddedModel()) + " --output_dir " + Quote(q) + " " + quantize_flags);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = RunNibble("export-onnx --model " + Quote(q) + " --out " + Quote(onnx) + " " + export_flags);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto model = nibble::Model::Load(q);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto prompt = (*model)->Tokenize("Once upon a time, the old lighthouse keeper");
  ASSERT_TRUE(prompt.ok());
  std::vector<int32_t> ids;
  std::vector<float> prefill;
  RunNibbleGreedy(q, *prompt, steps, &ids, &prefill);
  const nlohmann::json ort = RunOrt(onnx, *prompt, steps, dtype);
  ASSERT_TRUE(ort.is_object());
  const std::vector<float> ort_logits = ort["prefill_logits"].get<std::vector<float>>();
  ASSERT_EQ(ort_logits.size(), prefill.size());
  double max_diff = 0;
  for (size_t i = 0; i < prefill.size(); ++i) max_diff = std::max(max_diff, std::fabs(double(ort_logits[i]) - prefill[i]));
  EXPECT_LT(max_diff, tol) << quantize_flags;
  EXPECT_EQ(ort["ids"].get<std::vector<int32_t>>(), ids) << quantize_flags;
  fs::remove_all(tmp);
}

class OnnxExport : public ::testing::TestWithParam<std::string> {};

// Both runtimes accumulate in fp32 (accuracy_level 1: no int8 activations), in different orders:
// over K <= 688 products of |a·w| below ~10 the rounding is ~K·2^-24·10 per dot product, growing
// through 6 layers; 2e-3 on logits of magnitude ~10 is about 40x that and far below the gaps
// greedy decoding turns on.
TEST_P(OnnxExport, OnnxRuntimeAgreesWithNibbleOnLogitsAndGreedyText) {
  std::string why;
  if (!OrtAvailable(&why)) GTEST_SKIP() << why;
  CheckAgainstNibble(GetParam(), "--accuracy_level 1", "fp32", 64, 2e-3);
}

// fp16 activations and KV cache: each rounding is 2^-11 relative (~0.006 on a logit of 12), and
// it compounds over 6 layers; 0.3 is about 3x what this model shows (0.11).
TEST(OnnxExportFp16, OnnxRuntimeStaysCloseToNibble) {
  std::string why;
  if (!OrtAvailable(&why)) GTEST_SKIP() << why;
  CheckAgainstNibble("--quant_scheme w_uint4_per_group_asym --group_size 128", "--io_dtype fp16 --accuracy_level 1",
                     "fp16", 16, 0.3);
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, OnnxExport,
    ::testing::Values("--quant_scheme w_uint4_per_group_asym --group_size 128 --exclude_layers '' "
                      "--layer_quant_config lm_head:group_size=32",
                      "--quant_scheme w_int4_per_group_sym --group_size 32",
                      "--quant_scheme w_uint4_per_group_asym --group_size 64 --model_export compressed-tensors",
                      // AutoAWQ GEMM and GPTQ v1 checkpoints, as quantize writes them.
                      "--quant_scheme w_uint4_per_group_asym --group_size 128 --model_export awq",
                      "--quant_scheme w_int4_per_group_sym --group_size 128 --model_export gptq --gptq_format v1"));

TEST(OnnxExportCli, RefusesWhatTheGraphCannotHoldBeforeWriting) {
  const fs::path tmp = fs::temp_directory_path() / ("nibble_onnx_bad_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  RunResult r = RunNibble("export-onnx --model " + Quote(EmbeddedModel()) + " --out " + Quote((tmp / "o").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("dense checkpoint has no int4 codes"), std::string::npos) << r.out;
  const std::string q = (tmp / "q").string();
  r = RunNibble("quantize --model_dir " + Quote(EmbeddedModel()) + " --output_dir " + Quote(q) +
                " --quant_scheme w_uint4_per_group_asym --group_size 48 --misaligned per_channel");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = RunNibble("export-onnx --model " + Quote(q) + " --out " + Quote((tmp / "o").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("has group_size 48"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp / "o"));
  r = RunNibble("export-onnx --model " + Quote(q) + " --out " + Quote((tmp / "o").string()) + " --io_dtype bf16");
  EXPECT_NE(r.out.find("--io_dtype \"bf16\" is not supported"), std::string::npos) << r.out;
  fs::remove_all(tmp);
}

// The README's main job builds only the target nibble: that must build nibble-export-onnx too,
// which `nibble export-onnx` runs (--help included); the export states itself in the model card.
TEST(OnnxExportCli, TargetNibbleBuildsTheHelperAndTheExportRuns) {
  RunResult r = RunNibble("export-onnx --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--accuracy_level"), std::string::npos) << r.out;
  const fs::path tmp = fs::temp_directory_path() / ("nibble_onnx_cli_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string q = (tmp / "q").string(), o = (tmp / "o").string();
  r = RunNibble("quantize --model_dir " + Quote(EmbeddedModel()) + " --output_dir " + Quote(q) +
                " --quant_scheme w_int4_per_group_sym --group_size 32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = RunNibble("export-onnx --model " + Quote(q) + " --out " + Quote(o));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(o + "/model.onnx"));
  const std::string card = ReadFile(o + "/README.md");
  EXPECT_EQ(card.rfind("## Exported to ONNX with nibble ", 0), 0u) << card;
  EXPECT_NE(card.find("\n- scheme: MatMulNBits block_size 32 (42 linears); float MatMul (1 linear)\n"), std::string::npos) << card;
  EXPECT_NE(card.find("\n---\n\n## Quantized with nibble "), std::string::npos) << card;
  fs::remove_all(tmp);
  if (!fs::exists(std::string(NIBBLE_BINARY_DIR) + "/build.ninja")) GTEST_SKIP() << "not a Ninja build tree";
  r = RunCommand("ninja -C " + Quote(NIBBLE_BINARY_DIR) + " -t query nibble 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| nibble-export-onnx\n"), std::string::npos) << "target nibble does not depend on nibble-export-onnx\n" << r.out;
}

// A copy of nibble without its helper says which file is missing and how to build it.
TEST(OnnxExportCli, NibbleAloneNamesTheMissingHelperAndHowToBuildIt) {
  const fs::path tmp = fs::temp_directory_path() / ("nibble_alone_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  fs::copy_file(NibbleBinary(), tmp / "nibble");
  RunResult r = RunCommand(Quote((tmp / "nibble").string()) + " export-onnx --help 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("nibble: error: export-onnx runs the program " + (tmp / "nibble-export-onnx").string() +
                       " (beside nibble), which does not exist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--target nibble-export-onnx"), std::string::npos) << r.out;
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace nibble_test
