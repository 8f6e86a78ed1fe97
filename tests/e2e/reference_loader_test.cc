// tests/reference/dequantize.py, an independent loader of every export format, against nibble.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace {

using nibble_test::ParsePerplexity;
using nibble_test::Quote;
using nibble_test::ReadFile;
using nibble_test::RunCommand;
using nibble_test::RunNibble;
using nibble_test::RunResult;

// tests/reference/dequantize.py, a loader written from SPEC.md alone (standard-library Python),
// turns each export into a dense F32 checkpoint; nibble must find the same model in both. The
// dequantized weight (q − z)·s is exact in fp32 (|q − z| ≤ 15 times a bf16 / fp16 scale of 8 / 11
// significant bits fits fp32's 24), so the two runs differ only in the order the int4 kernels and
// the dense GEMM sum their fp32 products — a relative error of order γ_K ≈ K·2⁻²⁴ per dot product, far
// below 0.1 % of perplexity. A wrong nibble order, zero point or group moves the weights by whole
// quantization steps, which costs percent of perplexity (the misread case below shows it).
struct ReferenceCase {
  std::string name, flags;
};

std::string ReferenceLoader() { return nibble_test::SourceDir() + "/tests/reference/dequantize.py"; }

double ProseValPerplexity(const std::string& model, const std::string& flags = "--seq_len 512 --max_windows 3") {
  const RunResult r = RunNibble("perplexity --model " + Quote(model) + " --text " +
                                Quote(nibble_test::SharedData("prose-val.txt")) + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << model << ": " << r.out;
  return ParsePerplexity(r.out);
}

// Short windows with fp32 activations on both sides (auto would run the int4 linears with bf16
// inputs: another rounding, ~0.1 % of perplexity here, than the dense checkpoint's fp32).
double ShortFp32Perplexity(const std::string& model) {
  return ProseValPerplexity(model, "--seq_len 128 --max_windows 4 --activations fp32");
}

RunResult RunReferenceLoader(const std::string& in, const std::string& out) {
  return RunCommand("python3 " + Quote(ReferenceLoader()) + " " + Quote(in) + " " + Quote(out) + " 2>&1");
}

// Replaces the first `from` in `text`; false when there is none.
bool ReplaceOnce(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  if (at == std::string::npos) return false;
  text.replace(at, from.size(), to);
  return true;
}

TEST(ReferenceLoader, ReadsEveryExportAsTheSameModel) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt", "data/prose-calib.txt");
  if (std::system("command -v python3 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found in PATH: tests/reference/dequantize.py cannot run";
  // The loader itself first: the specification's test vectors read back exactly.
  const RunResult self = RunCommand("python3 " + Quote(ReferenceLoader()) + " --self-test 2>&1");
  ASSERT_EQ(self.exit_code, 0) << self.out;
  const std::string model = nibble_test::EmbeddedModel();
  nibble_test::TempDir dir("nibble_reference_");
  const double fp = ProseValPerplexity(model);
  ASSERT_GT(fp, 1.0);
  const std::string asym128 = "--quant_scheme w_uint4_per_group_asym --group_size 128",
                    sym32 = "--quant_scheme w_int4_per_group_sym --group_size 32";
  const std::vector<ReferenceCase> cases = {
      {"quark-asym-g128-reorder", asym128 + " --pack_method reorder"},
      {"quark-sym-g32-order", sym32 + " --pack_method order"},
      {"ct-asym-g128", asym128 + " --model_export compressed-tensors"},
      {"ct-sym-g32", sym32 + " --model_export compressed-tensors"},
      {"awq-asym-g128", asym128 + " --model_export awq"},
      {"gptq-v1-asym-g128", asym128 + " --model_export gptq --gptq_format v1"},
      {"gptq-v2-sym-g32", sym32 + " --model_export gptq --gptq_format v2"},
      // GPTQ with act-order groups: a non-monotonic g_idx in the file.
      {"gptq-v2-actorder-group", asym128 + " --model_export gptq --gptq_format v2 --quant_algo gptq --actorder group "
                                           "--gptq_scale_timing dynamic --num_calib_data 16 --seq_len 128 --dataset " +
                                           Quote(nibble_test::SharedData("prose-calib.txt"))},
  };
  std::printf("float model: perplexity %.4f\n", fp);
  std::map<std::string, double> quantized;
  for (const ReferenceCase& c : cases) {
    const std::string q = dir.sub(c.name), d = q + "-dense";
    RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) + " " + c.flags);
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.out;
    r = RunReferenceLoader(q, d);
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(": 42 quantized linears dequantized"), std::string::npos) << c.name << ": " << r.out;
    const double pq = ProseValPerplexity(q), pd = ProseValPerplexity(d);
    quantized[c.name] = pq;
    std::printf("%-24s quantized %.4f  dequantized %.4f  (%+.4f %%; float %+.3f %%)\n", c.name.c_str(), pq, pd,
                100.0 * (pd / pq - 1.0), 100.0 * (pd / fp - 1.0));
    EXPECT_NEAR(pd, pq, 0.001 * pq) << c.name;
    if (c.name.find("actorder") != std::string::npos) {  // the loader says how it runs a g_idx
      r = RunNibble("generate --model " + Quote(q) + " -n 1 --temperature 0 --prompt x");
      EXPECT_NE(r.out.find("note: " + q + ": 42 int4 linears have an act-order g_idx"), std::string::npos) << r.out;
    }
    // The dense checkpoint holds the int4 model, not the float weights copied through.
    EXPECT_GT(std::fabs(pd / fp - 1.0), 0.0005) << c.name << ": dequantized " << pd << " vs float " << fp;
  }

  // The check can fail: the same words read in the other nibble order are another model.
  const std::string src = dir.sub("quark-sym-g32-order");
  const std::filesystem::path bad = dir.sub("misread");
  std::filesystem::create_directories(bad);
  for (const auto& f : std::filesystem::directory_iterator(src))
    if (f.path().filename() != "config.json") std::filesystem::copy_file(f.path(), bad / f.path().filename());
  std::string config = ReadFile(src + "/config.json");
  ASSERT_TRUE(ReplaceOnce(config, "\"pack_method\": \"order\"", "\"pack_method\": \"reorder\"")) << config;
  dir.Write("misread/config.json", config);
  RunResult r = RunReferenceLoader(bad, bad.string() + "-dense");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const double pq = quantized["quark-sym-g32-order"], pm = ProseValPerplexity(bad.string() + "-dense");
  std::printf("%-24s quantized %.4f  dequantized %.4f  (%+.4f %%)\n", "misread as reorder", pq, pm, 100.0 * (pm / pq - 1.0));
  EXPECT_GT(std::fabs(pm / pq - 1.0), 0.01) << "reorder misreading " << pm << " vs " << pq;

  // And what it does not understand is an error naming the key, not a guess.
  ASSERT_TRUE(ReplaceOnce(config, "\"quant_method\": \"quark\"", "\"quant_method\": \"bitnet\"")) << config;
  dir.Write("misread/config.json", config);
  r = RunReferenceLoader(bad, bad.string() + "-unknown");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("quantization_config.quant_method is \"bitnet\""), std::string::npos) << r.out;
}

// A Qwen3-shaped model (per-head q_norm / k_norm, head_dim 32 given explicitly while hidden /
// heads is 16, no q/k/v bias, tied embeddings) through AWQ -> Quark hf_format -> the independent
// loader: the same perplexity as nibble's reading of the export, the norms copied through as
// float. tiny_llama.h's weights with the (tied) embedding scaled to N(0, 0.3²): logits of a few
// units, so the int4 model is measurably another model than the float one while the perplexity
// stays in the hundreds (N(0, 1) gives ~1e23, where summation-order rounding alone moves it by
// 0.1 %).
TEST(ReferenceLoader, Qwen3AwqQuarkReadsAsTheSameModel) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/prose-val.txt", "data/tinyshakespeare.txt");
  if (std::system("command -v python3 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found in PATH: tests/reference/dequantize.py cannot run";
  nibble_test::TempDir dir("nibble_reference_qwen3_");
  nibble_test::TinyLlamaSpec s;
  s.model_type = "qwen3";
  s.architecture = "Qwen3ForCausalLM";
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 32;
  s.write_head_dim = true;
  s.tie = true;
  s.qk_norm = true;
  s.extra = {{"use_sliding_window", false}, {"sliding_window", nullptr}};
  const std::string model = dir.sub("qwen3"), q = dir.sub("qwen3-awq"), d = dir.sub("qwen3-awq-dense");
  nibble_test::WriteTinyModel(model, s, [](const std::string& name, std::vector<float>& v) {
    if (name == "model.embed_tokens.weight")
      for (float& x : v) x *= 0.3f;
  });
  const std::string calib = nibble_test::TinyCalibFile(dir.sub("calib.txt"));
  RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) +
                          " --quant_algo awq --quant_scheme w_uint4_per_group_asym --group_size 32 --dataset " +
                          Quote(calib) + " --num_calib_data 4 --seq_len 64");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = RunReferenceLoader(q, d);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("quark: 14 quantized linears dequantized"), std::string::npos) << r.out;
  // fp32 activations on both sides (auto would run the int4 linears with bf16 inputs: another
  // rounding, ~0.1 % of perplexity here, than the dense checkpoint's fp32).
  const double fp = ShortFp32Perplexity(model), pq = ShortFp32Perplexity(q), pd = ShortFp32Perplexity(d);
  std::printf("qwen3-shaped: float %.4f  awq quark %.4f  dequantized by the reference loader %.4f (%+.4f %%)\n", fp, pq,
              pd, 100.0 * (pd / pq - 1.0));
  ASSERT_GT(fp, 1.0);
  EXPECT_NEAR(pd, pq, 0.001 * pq);
  EXPECT_GT(std::fabs(pd / fp - 1.0), 0.0005) << "dequantized " << pd << " vs float " << fp;
  // q_norm / k_norm: float in the export and in the loader's output, the input's values.
  const std::string cfg = ReadFile(d + "/config.json");
  EXPECT_EQ(cfg.find("quantization_config"), std::string::npos) << cfg;
  r = RunCommand("python3 -c " + Quote("import json,struct,sys\n"
                                      "for p in sys.argv[1:]:\n"
                                      "  f=open(p+'/model.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]\n"
                                      "  h=json.loads(f.read(n)); t=h['model.layers.1.self_attn.k_norm.weight']\n"
                                      "  print(p[-5:], t['dtype'], t['shape'])") +
                 " " + Quote(model) + " " + Quote(q) + " " + Quote(d));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("wen3 F16 [32]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3-awq F16 [32]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dense F16 [32]"), std::string::npos) << r.out;
}

// A tied model's lm_head quantized (`--layer_quant_config lm_head:...`): nibble writes an untied
// int4 lm_head built from the embedding; the independent loader reads the same model, with 15
// quantized linears (2 layers x 7 and lm_head).
TEST(ReferenceLoader, TiedHeadQuantizedFromTheEmbeddingReadsAsTheSameModel) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/prose-val.txt");
  if (std::system("command -v python3 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found in PATH: tests/reference/dequantize.py cannot run";
  nibble_test::TempDir dir("nibble_reference_tied_");
  nibble_test::TinyLlamaSpec s;
  s.tie = true;
  const std::string model = dir.sub("tied"), q = dir.sub("tied-q"), d = dir.sub("tied-q-dense");
  nibble_test::WriteTinyModel(model, s, [](const std::string& name, std::vector<float>& v) {
    if (name == "model.embed_tokens.weight")
      for (float& x : v) x *= 0.3f;
  });
  RunResult r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) +
                          " --group_size 32 --layer_quant_config lm_head:group_size=32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("lm_head: tie_word_embeddings is true; quantized from model.embed_tokens.weight and written "
                       "untied"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("matched no layer"), std::string::npos) << r.out;
  r = RunReferenceLoader(q, d);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("quark: 15 quantized linears dequantized"), std::string::npos) << r.out;
  const double fp = ShortFp32Perplexity(model), pq = ShortFp32Perplexity(q), pd = ShortFp32Perplexity(d);
  std::printf("tied lm_head quantized: float %.4f  quark %.4f  dequantized by the reference loader %.4f\n", fp, pq, pd);
  ASSERT_GT(fp, 1.0);
  EXPECT_NEAR(pd, pq, 0.001 * pq);
  EXPECT_GT(std::fabs(pd / fp - 1.0), 0.0005) << "dequantized " << pd << " vs float " << fp;
  EXPECT_NE(ReadFile(q + "/config.json").find("\"tie_word_embeddings\": false"), std::string::npos);
}

}  // namespace
