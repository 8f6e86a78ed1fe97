// The README.md of what quantize / convert / export-onnx write: a note of what was done to the
// weights at the top (algorithm, scheme, calibration, excluded layers, format, nibble release),
// then the input's model card unchanged; the note alone when the input has no card.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::Quote;
using nibble_test::ReadFile;
using nibble_test::RunNibble;
using nibble_test::RunResult;

constexpr auto npos = std::string::npos;

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// prose-llama-7m: 6 layers x 7 projections quantized, lm_head kept in float by default.
TEST(ModelCard, QuantizeStatesTheQuantizationAboveTheOriginalCard) {
  const std::string model = nibble_test::EmbeddedModel();
  nibble_test::TempDir dir("nibble_card_");
  const std::string q = dir.sub("q");
  RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) +
                          " --quant_scheme w_uint4_per_group_asym --group_size 128");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string card = ReadFile(q + "/README.md"), original = ReadFile(model + "/README.md");
  EXPECT_EQ(card.rfind("## Quantized with nibble ", 0), 0u) << card;
  for (const char* line : {"\n- algorithm: RTN (round to nearest)\n", "\n- scheme: uint4 per_group g128 (42 linears) (",
                           "\n- excluded layers (kept in float): lm_head\n",
                           "\n- export format: hf_format (AMD Quark hf_format), quant_method quark in config.json\n"})
    EXPECT_NE(card.find(line), npos) << line << " not in\n" << card;
  EXPECT_EQ(card.substr(0, card.find("\n---\n")).find("calibration"), npos) << "RTN has no calibration data\n" << card;
  EXPECT_TRUE(EndsWith(card, "\n---\n\n" + original)) << card;

  // A conversion says so above the quantization note, which stays.
  const std::string c = dir.sub("c");
  r = RunNibble("convert --in " + Quote(q) + " --out " + Quote(c) + " --to awq");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string converted = ReadFile(c + "/README.md");
  EXPECT_EQ(converted.rfind("## Converted with nibble ", 0), 0u) << converted;
  EXPECT_NE(converted.find("from quark to awq"), npos) << converted;
  EXPECT_NE(converted.find("\n- scheme: uint4 per_group g128 (42 linears)\n"), npos) << converted;
  EXPECT_TRUE(EndsWith(converted, "\n---\n\n" + card)) << converted;
}

// A calibrated export names its data and sample counts; an input without README.md gets the note alone.
TEST(ModelCard, CalibratedExportNamesItsDataAndAMissingCardIsWritten) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  const std::string model = nibble_test::EmbeddedModel();
  nibble_test::TempDir dir("nibble_card_");
  const std::string in = dir.sub("in"), q = dir.sub("q");
  fs::create_directories(in);
  for (const auto& e : fs::directory_iterator(model))
    if (e.is_regular_file() && e.path().filename() != "README.md") fs::copy_file(e.path(), in + "/" + e.path().filename().string());
  RunResult r = RunNibble("quantize --model_dir " + Quote(in) + " --output_dir " + Quote(q) +
                          " --quant_scheme w_int4_per_group_sym --group_size 64 --quant_algo awq --num_calib_data 4 --seq_len 64"
                          " --model_export compressed-tensors --exclude_layers '' --dataset " +
                          Quote(nibble_test::SharedData("prose-calib.txt")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string card = ReadFile(q + "/README.md");
  EXPECT_EQ(card.rfind("## Quantized with nibble ", 0), 0u) << card;
  for (const char* line : {"\n- algorithm: AWQ (activation-aware scaling)\n",
                           "\n- scheme: int4 per_group g64 (43 linears) (",
                           "\n- calibration: prose-calib.txt, 4 samples x 64 tokens (the first in order)\n",
                           "\n- excluded layers (kept in float): none\n", "\n- export format: compressed-tensors ("})
    EXPECT_NE(card.find(line), npos) << line << " not in\n" << card;
  EXPECT_EQ(card.find("---"), npos) << "no original card to part from\n" << card;
}

}  // namespace
