// `nibble convert` and `nibble verify` on the embedded model: every ordered pair of formats
// round-trips byte for byte, and verify tells identical checkpoints from ones that differ by a
// single code.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

using nibble_test::Quote;
using nibble_test::ReadFile;
using nibble_test::RunNibble;
using nibble_test::RunResult;

// One way of writing a checkpoint: quantize's export flags and convert's target flags.
struct Format {
  std::string name, export_flags, to_flags;
  bool awq = false;  // AutoAWQ GEMM: asymmetric only, lm_head float
};

const std::vector<Format>& AllFormats() {
  static const std::vector<Format> f = {
      {"quark-reorder", "--model_export hf_format --pack_method reorder", "--to hf_format --pack_method reorder"},
      {"quark-order", "--model_export hf_format --pack_method order", "--to hf_format --pack_method order"},
      {"compressed-tensors", "--model_export compressed-tensors", "--to compressed-tensors"},
      {"awq", "--model_export awq", "--to awq", true},
      {"gptq-v1", "--model_export gptq --gptq_format v1", "--to gptq --gptq_format v1"},
      {"gptq-v2", "--model_export gptq --gptq_format v2", "--to gptq --gptq_format v2"},
  };
  return f;
}

// The files a conversion writes from the codes (the others are copied).
void ExpectSameFiles(const std::string& a, const std::string& b, const std::string& what) {
  for (const char* f : {"/model.safetensors", "/config.json", "/quantize_config.json"})
    EXPECT_EQ(ReadFile(a + f), ReadFile(b + f)) << what << ": " << f << " differs";
}

// For every ordered pair (A, B): quantize --model_export A, convert to B, convert back to A:
// byte-identical to A's export, and verify says A and B hold the same model. The last scheme
// quantizes lm_head too (stored under other tensor names in each format).
TEST(Convert, EveryOrderedPairRoundTripsByteForByte) {
  const std::string model = nibble_test::EmbeddedModel();
  nibble_test::TempDir dir("nibble_convert_");
  struct Scheme {
    std::string name, flags;
    bool awq;  // AutoAWQ GEMM holds it
  };
  for (const Scheme& s : {Scheme{"asym-g128", "--quant_scheme w_uint4_per_group_asym --group_size 128", true},
                          Scheme{"sym-g32", "--quant_scheme w_int4_per_group_sym --group_size 32", false},
                          Scheme{"asym-g32-lm_head", "--quant_scheme w_uint4_per_group_asym --group_size 32 --exclude_layers ''", false}}) {
    for (const Format& a : AllFormats()) {
      if (a.awq && !s.awq) continue;
      const std::string qa = dir.sub(a.name + "-" + s.name);
      RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(qa) + " " + s.flags + " " +
                              a.export_flags);
      ASSERT_EQ(r.exit_code, 0) << a.name << ": " << r.out;
      for (const Format& b : AllFormats()) {
        if (b.name == a.name || (b.awq && !s.awq)) continue;
        const std::string what = s.name + ": " + a.name + " -> " + b.name + " -> " + a.name;
        const std::string mid = qa + "-" + b.name, back = mid + "-back";
        r = RunNibble("convert --in " + Quote(qa) + " --out " + Quote(mid) + " " + b.to_flags);
        ASSERT_EQ(r.exit_code, 0) << what << ": " << r.out;
        r = RunNibble("verify --differences_only " + Quote(qa) + " " + Quote(mid));
        EXPECT_EQ(r.exit_code, 0) << what << ": " << r.out;
        r = RunNibble("convert --in " + Quote(mid) + " --out " + Quote(back) + " " + a.to_flags);
        ASSERT_EQ(r.exit_code, 0) << what << ": " << r.out;
        ExpectSameFiles(qa, back, what);
        std::filesystem::remove_all(mid);
        std::filesystem::remove_all(back);
      }
    }
  }
  // A dense input has nothing to convert.
  RunResult dense = RunNibble("convert --in " + Quote(model) + " --out " + Quote(dir.sub("x")) + " --to awq");
  EXPECT_NE(dense.exit_code, 0);
  EXPECT_NE(dense.out.find("dense checkpoint"), std::string::npos) << dense.out;
}

// GPTQ's settings survive a GPTQ -> GPTQ conversion, and convert's errors name convert's flags.
TEST(Convert, GptqSettingsSurviveAndErrorsNameConvertsFlags) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  const std::string model = nibble_test::EmbeddedModel();
  nibble_test::TempDir dir("nibble_convert_");
  const std::string q = dir.sub("gptq"), v2 = dir.sub("v2");
  RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) +
                          " --quant_scheme w_int4_per_group_sym --group_size 128 --quant_algo gptq --dampening_frac 0.05"
                          " --num_calib_data 4 --seq_len 64 --model_export gptq --dataset " +
                          Quote(nibble_test::SharedData("prose-calib.txt")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = RunNibble("convert --in " + Quote(q) + " --out " + Quote(v2) + " --to gptq --gptq_format v2 --pack_method order");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: --pack_method order is used only by --to hf_format"), std::string::npos) << r.out;
  const nlohmann::json qc = nlohmann::json::parse(ReadFile(v2 + "/quantize_config.json"));
  EXPECT_EQ(qc["damp_percent"], 0.05) << qc.dump();
  EXPECT_EQ(qc["checkpoint_format"], "gptq_v2") << qc.dump();
  r = RunNibble("convert --in " + Quote(q) + " --out " + Quote(dir.sub("x")) + " --to gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--to \"gguf\" is not supported"), std::string::npos) << r.out;
  r = RunNibble("convert --in " + Quote(q) + " --out " + Quote(dir.sub("x")) + " --to awq");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out.find("--model_export"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("symmetric"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir.sub("x")));
  // Flags the run does not use are named, not silently dropped; a GPTQ setting without GPTQ is refused.
  r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(dir.sub("rtn")) +
                " --actorder group --model_export compressed-tensors");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--actorder group is a GPTQ setting; --quant_algo rtn does not use it"), std::string::npos) << r.out;
  r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(dir.sub("rtn")) +
                " --gptq_format v2 --model_export compressed-tensors");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: --gptq_format v2 is used only by --model_export gptq"), std::string::npos) << r.out;
}

// Flips the lowest bit of the first data byte of `tensor` in a safetensors file: the first code
// of the packed word moves by one.
void FlipFirstBit(const std::string& file, const std::string& tensor) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  ASSERT_TRUE(h.contains(tensor)) << tensor << " not in " << file;
  const std::streamoff at = static_cast<std::streamoff>(8 + header_len + h[tensor]["data_offsets"][0].get<uint64_t>());
  char byte = 0;
  f.seekg(at);
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 1);
  f.seekp(at);
  f.write(&byte, 1);
}

TEST(Verify, NamesTheOneLinearWhoseCodeChanged) {
  const std::string model = nibble_test::EmbeddedModel();
  nibble_test::TempDir dir("nibble_verify_");
  const std::string q = dir.sub("ct"), changed = dir.sub("changed");
  RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) +
                          " --quant_scheme w_uint4_per_group_asym --group_size 128 --model_export compressed-tensors");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::filesystem::copy(q, changed, std::filesystem::copy_options::recursive);
  FlipFirstBit(changed + "/model.safetensors", "model.layers.0.mlp.up_proj.weight_packed");
  r = RunNibble("verify --differences_only " + Quote(q) + " " + Quote(changed));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("model.layers.0.mlp.up_proj"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 of 196608 values"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DIFFERENT: 1 of 43 linears and 0 of 14 other tensors differ"), std::string::npos) << r.out;
  // A norm weight changed: an "other tensor" differs, every linear is identical.
  std::filesystem::remove_all(changed);
  std::filesystem::copy(q, changed, std::filesystem::copy_options::recursive);
  FlipFirstBit(changed + "/model.safetensors", "model.norm.weight");
  r = RunNibble("verify " + Quote(q) + " " + Quote(changed));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("DIFFERENT: 0 of 43 linears and 1 of 14 other tensors differ"), std::string::npos) << r.out;
  // Against the float model every quantized linear differs; the float lm_head and tensors do not.
  r = RunNibble("verify " + Quote(q) + " " + Quote(model));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("B: " + model + " (dense)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DIFFERENT: 42 of 43 linears and 0 of 14 other tensors differ"), std::string::npos) << r.out;
  // An unreadable side is exit code 2, naming which.
  r = RunNibble("verify " + Quote(q) + " " + Quote(dir.sub("missing")));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("B: "), std::string::npos) << r.out;
}

}  // namespace
