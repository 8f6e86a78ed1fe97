// --calib_dtype: fp32 keeps the fp32 pipeline's bytes (sums of its outputs before the option
// existed), bf16 gives the same bytes at any thread count, and the calibration linears compute
// what their dtype says.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "base/sha256.h"
#include "e2e/run_nibble.h"
#include "formats/float_dtype.h"
#include "io/file.h"
#include "model/config.h"
#include "quantize/algorithm.h"
#include "quantize/calib_dtype.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

using nibble_test::TempDir;

// sha256 of OUT/model.safetensors.
std::string WeightsSum(const std::string& out) {
  auto bytes = nibble::ReadFileToString(out + "/model.safetensors");
  return bytes.ok() ? nibble::Sha256Hex(*bytes) : "error: " + bytes.error().message;
}

// sha256 of model.safetensors of `nibble quantize` of prose-llama-7m into a fresh directory.
std::string QuantizedSum(const std::string& algo, const std::string& calib_dtype, int threads, const TempDir& tmp,
                         int64_t chunks = 4, int64_t seq_len = 64) {
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::SharedModel("prose-llama-7m");
  r.output_dir = tmp.sub(algo + "-" + calib_dtype + "-" + std::to_string(threads) + "-" + std::to_string(chunks));
  r.quant_algo = algo;
  r.dataset = nibble_test::SharedData("prose-calib.txt");
  r.num_calib_data = chunks;
  r.seq_len = seq_len;
  r.calib_dtype = calib_dtype;
  r.threads = threads;
  auto s = nibble::Quantize(r);
  if (!s.ok()) return "error: " + s.error().message;
  return WeightsSum(r.output_dir);
}

// The same through the CLI with OpenBLAS's kernels pinned to its Zen set. OpenBLAS picks its
// kernels by CPU model when it loads (Debian's build takes an AMD Zen for Zen, an Emerald Rapids
// Xeon for Prescott) and GPTQ's factorisations round differently with each, so sums written on one
// host hold on another only with the same kernels (any x86-64 with AVX2 runs the Zen set).
std::string CliQuantizedSum(const std::string& algo, int threads, const TempDir& tmp) {
  const std::string out = tmp.sub("cli-" + algo + "-" + std::to_string(threads));
  const nibble_test::RunResult r = nibble_test::RunCommand(
      "OPENBLAS_CORETYPE=Zen " + nibble_test::Quote(nibble_test::NibbleBinary()) + " quantize --model_dir " +
      nibble_test::Quote(nibble_test::SharedModel("prose-llama-7m")) + " --output_dir " + nibble_test::Quote(out) +
      " --quant_algo " + algo + " --dataset " + nibble_test::Quote(nibble_test::SharedData("prose-calib.txt")) +
      " --num_calib_data 4 --seq_len 64 --calib_dtype fp32 --threads " + std::to_string(threads) + " 2>&1");
  return r.exit_code == 0 ? WeightsSum(out) : "error: " + r.out;
}

// The sums the fp32 pipeline wrote before --calib_dtype existed (scripts/export_sums.sh's
// prose-llama-7m-{awq,gptq,awq+gptq}-hf_format runs: 4 x 64 tokens of prose-calib.txt).
TEST(CalibDType, Fp32KeepsTheFp32PipelineBytesAtOneAndTwoThreads) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m", "data/prose-calib.txt");
  const std::vector<std::pair<std::string, std::string>> golden = {
      {"awq", "c723cabe8a4dee9547d70dec999cfc7e83d0b0ade0c4015bc5a5fd844f49a3d8"},
      {"gptq", "41761ee56e5d65a425a09c8fbc3944b5b987f64f6a725d4f8fe4953732762ce9"},
      {"awq,gptq", "45bcad20255dc6091efa3c91693dd3d599d5fcd2f234dda8de22add7d4f8319c"}};
  TempDir tmp;
  for (const auto& [algo, sum] : golden)
    for (int threads : {1, 2}) EXPECT_EQ(CliQuantizedSum(algo, threads, tmp), sum) << algo << ", " << threads << " thread(s)";
}

TEST(CalibDType, Bf16IsTheDefaultForABf16ModelAndThreadCountIndependent) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m", "data/prose-calib.txt");
  TempDir tmp;
  const std::string one = QuantizedSum("awq,gptq", "bf16", 1, tmp);
  ASSERT_EQ(one.find("error"), std::string::npos) << one;
  EXPECT_EQ(QuantizedSum("awq,gptq", "bf16", 2, tmp), one);
  EXPECT_EQ(QuantizedSum("awq,gptq", "auto", 2, tmp), one);  // torch_dtype bfloat16
  EXPECT_NE(one, "45bcad20255dc6091efa3c91693dd3d599d5fcd2f234dda8de22add7d4f8319c");  // not the fp32 bytes
}

// GPTQ alone in bf16 runs each layer in chunks of sequences (pipeline.h ChunkedLayer): 5 x 512
// tokens are two chunks (4 sequences, then 1), whose Gram matrices are summed in chunk order.
TEST(CalibDType, Bf16GptqInChunksIsThreadCountIndependent) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m", "data/prose-calib.txt");
  TempDir tmp;
  const std::string one = QuantizedSum("gptq", "bf16", 1, tmp, 5, 512);
  ASSERT_EQ(one.find("error"), std::string::npos) << one;
  EXPECT_EQ(QuantizedSum("gptq", "bf16", 2, tmp, 5, 512), one);
  EXPECT_NE(QuantizedSum("gptq", "fp32", 2, tmp, 5, 512), one);
}

// prose-llama-7m (group_size 64) through RunLayerPipeline: `chain_name` resolved from `flags`,
// run in flags.calib_dtype, each layer in chunks or on whole rows as `chunked` says, the runner's
// attention stages reused or not; every tensor to `sink`. `plan_chunks`: what the plan decides.
nibble::Result<nibble::PipelineResult> RunChain(const std::string& chain_name, const nibble::AlgorithmFlags& flags,
                                                bool chunked, bool reuse, const std::vector<int32_t>& tokens,
                                                int64_t batch, int64_t seq, const nibble::LayerTensorSink& sink,
                                                bool* plan_chunks) {
  const std::string dir = nibble_test::SharedModel("prose-llama-7m");
  NIBBLE_ASSIGN_OR_RETURN(nibble::ModelConfig mc, nibble::LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(auto store, nibble::TensorStore::OpenDir(dir));
  nibble::QuarkQuantConfig cfg;
  cfg.global = nibble::WeightQuantSpec{};
  cfg.global->group_size = 64;
  NIBBLE_ASSIGN_OR_RETURN(auto parsed, nibble::ParseAlgorithmChain(chain_name));
  NIBBLE_ASSIGN_OR_RETURN(auto algos, nibble::ResolveAlgorithms(parsed, flags, nullptr));
  *plan_chunks = algos.ChunkedLayers(mc);
  std::vector<std::unique_ptr<nibble::LayerAlgorithm>> owned;
  for (auto& a : algos.MakeAlgorithms()) owned.push_back(std::move(a));
  nibble::AlgorithmChain chain(std::move(owned));
  nibble::PipelineOptions po;
  po.propagation = algos.propagation();
  po.calib_dtype = flags.calib_dtype;
  po.chunked = chunked;
  po.reuse_attention = reuse;
  return nibble::RunLayerPipeline(mc, store, cfg, tokens, batch, seq, chain, po, sink);
}

// RunChain of `chain_name` in bf16 on batch x seq synthetic tokens, AWQ's default mappings or
// (`reorder`) an order where one that rescales the attention comes between two that read the MLP
// stages: every tensor the sink receives and the per-linear report.
struct PipelineOutput {
  std::map<std::string, std::vector<float>> tensors;
  std::vector<nibble::LayerReport> layers;
};
PipelineOutput RunBf16(const std::string& chain_name, bool whole_rows, int64_t batch, int64_t seq, bool reuse = true,
                       bool reorder = false) {
  PipelineOutput out;
  nibble::AlgorithmFlags flags;
  flags.calib_dtype = nibble::CalibDType::kBf16;
  if (reorder) {
    const auto d = nibble::DefaultLlamaScalingLayers();
    flags.awq.scaling_layers = {d[2], d[0], d[3], d[1]};
  }
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < batch * seq; ++i) tokens.push_back(static_cast<int32_t>(3 + (i * 7919 + i / seq) % 4000));
  auto sink = [&out](nibble::LayerTensor t) {
    out.tensors[t.name] = std::move(t.values);
    return nibble::Status::Ok();
  };
  bool plan_chunks = false;
  auto r = RunChain(chain_name, flags, !whole_rows, reuse, tokens, batch, seq, sink, &plan_chunks);
  EXPECT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(plan_chunks) << chain_name << ": the plan chunks a bf16 calibration of this chain";
  if (r.ok()) out.layers = r->layers;
  return out;
}

// Every tensor and report figure of `a` equal to `b`'s.
void ExpectSameOutput(const PipelineOutput& a, const PipelineOutput& b, const std::string& what) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (const auto& [name, v] : b.tensors) EXPECT_TRUE(a.tensors.at(name) == v) << what << ": " << name;
  ASSERT_EQ(a.layers.size(), b.layers.size()) << what;
  for (size_t l = 0; l < b.layers.size(); ++l)
    for (size_t i = 0; i < b.layers[l].linears.size(); ++i) {
      const nibble::LinearErrorReport &x = a.layers[l].linears[i], &y = b.layers[l].linears[i];
      EXPECT_EQ(x.rtn_error, y.rtn_error) << what << ": " << x.name;
      EXPECT_EQ(x.method_error, y.method_error) << what << ": " << x.name;
      EXPECT_GT(x.method_error, 0.0) << what << ": " << x.name;
    }
}

// AWQ and AWQ+GPTQ in bf16 run each layer in chunks of sequences (pipeline.h ChunkedLayer: the
// searches read 16-bit rows, mean |x| and Gram matrices accumulated chunk by chunk, the report
// measures RTN before the scales, and the attention residual kept by a capture serves the later
// ones and the fp pass): 20 x 128 tokens are two chunks (16 and 4 sequences), and every tensor
// and report figure is the whole-rows path's, with the attention reused or recomputed, in the
// default mapping order and in one where the attention is rescaled between two MLP mappings.
TEST(CalibDType, Bf16AwqInChunksGivesTheWholeRowsBytes) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m");
  for (const std::string chain : {"awq", "awq,gptq"}) {
    const PipelineOutput whole = RunBf16(chain, true, 20, 128);
    ExpectSameOutput(RunBf16(chain, false, 20, 128), whole, chain + " in chunks");
    if (chain != "awq") continue;
    ExpectSameOutput(RunBf16(chain, false, 20, 128, false), whole, chain + " in chunks, attention recomputed");
    ExpectSameOutput(RunBf16(chain, false, 20, 128, true, true), RunBf16(chain, true, 20, 128, false, true),
                     chain + " in chunks, reordered mappings");
  }
}

// The pipeline runs a layer in chunks only as told (PipelineOptions::chunked, from the plan); told
// so for an algorithm that needs the activations (AWQ's clip search, GPTQ's true_sequential) or
// for an fp32 calibration, it stops with an error instead of skipping that work.
TEST(CalibDType, ChunkedPipelineRefusesWhatCannotRunInChunks) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m");
  auto run = [](const std::string& chain_name, nibble::AlgorithmFlags flags, nibble::CalibDType calib) {
    flags.calib_dtype = calib;
    bool plan_chunks = true;
    auto r = RunChain(chain_name, flags, /*chunked=*/true, /*reuse=*/true, std::vector<int32_t>(2 * 32, 5), 2, 32,
                      [](nibble::LayerTensor) { return nibble::Status::Ok(); }, &plan_chunks);
    EXPECT_FALSE(plan_chunks) << chain_name;
    return r.ok() ? std::string("ok") : r.error().message;
  };
  nibble::AlgorithmFlags clip;
  clip.awq.clip = true;
  EXPECT_NE(run("awq", clip, nibble::CalibDType::kBf16).find("clip search needs the calibration activations"),
            std::string::npos);
  nibble::AlgorithmFlags seq;
  seq.gptq.true_sequential = true;
  EXPECT_NE(run("gptq", seq, nibble::CalibDType::kBf16).find("true_sequential needs the calibration activations"),
            std::string::npos);
  EXPECT_NE(run("gptq", {}, nibble::CalibDType::kFp32).find("needs a 16-bit calibration dtype"), std::string::npos);
}

TEST(CalibDType, ParsesResolvesAndSizes) {
  EXPECT_EQ(*nibble::ParseCalibDType("bf16", "--calib_dtype"), nibble::CalibDType::kBf16);
  EXPECT_EQ(*nibble::ParseCalibDType("auto", "--calib_dtype"), nibble::CalibDType::kAuto);
  auto bad = nibble::ParseCalibDType("float16", "--calib_dtype");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--calib_dtype \"float16\""), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("auto, bf16, fp16, fp32"), std::string::npos) << bad.error().message;
  nibble::ModelConfig mc;
  mc.torch_dtype = "bfloat16";
  EXPECT_EQ(nibble::ResolveCalibDType(nibble::CalibDType::kAuto, mc), nibble::CalibDType::kBf16);
  mc.torch_dtype = "float16";
  EXPECT_EQ(nibble::ResolveCalibDType(nibble::CalibDType::kAuto, mc), nibble::CalibDType::kFp16);
  mc.torch_dtype = "";
  EXPECT_EQ(nibble::ResolveCalibDType(nibble::CalibDType::kAuto, mc), nibble::CalibDType::kFp32);
  EXPECT_EQ(nibble::ResolveCalibDType(nibble::CalibDType::kFp32, mc), nibble::CalibDType::kFp32);
  EXPECT_EQ(nibble::CarriedActivationBytes(nibble::CalibDType::kBf16), 2);
  EXPECT_EQ(nibble::CarriedActivationBytes(nibble::CalibDType::kFp32), 4);
}

TEST(CalibDType, CarriedActivationsRoundTripInTheirDType) {
  std::vector<float> v = {1.0f, 1.00390625f + 1e-4f, -3.14159f, 65504.0f, 1e-8f};
  for (nibble::CalibDType t : {nibble::CalibDType::kBf16, nibble::CalibDType::kFp16, nibble::CalibDType::kFp32}) {
    nibble::CarriedActivations c(t);
    c.Store(std::vector<float>(v));
    EXPECT_EQ(c.bytes(), static_cast<int64_t>(v.size()) * nibble::CarriedActivationBytes(t));
    std::vector<float> wide;
    const float* x = c.Take(&wide);
    const nibble::DType dt = t == nibble::CalibDType::kBf16   ? nibble::DType::kBF16
                             : t == nibble::CalibDType::kFp16 ? nibble::DType::kF16
                                                              : nibble::DType::kF32;
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(x[i], nibble::RoundToDType(v[i], dt)) << i;
  }
}

// Each calibration linear against a double dot product of the values rounded to its dtype: the
// products are exact, so only the fp32 accumulation differs (bounded by K · 2^-24 · Σ|x·w|).
TEST(CalibDType, LinearsMultiplyTheRoundedValues) {
  const int64_t m = 37, n = 48, k = 160;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k), b(n);
  auto w = std::make_shared<std::vector<float>>(n * k);
  for (float& v : x) v = d(rng);
  for (float& v : *w) v = d(rng);
  for (float& v : b) v = d(rng);
  for (nibble::CalibDType t : {nibble::CalibDType::kBf16, nibble::CalibDType::kFp16, nibble::CalibDType::kFp32}) {
    const nibble::DType dt = t == nibble::CalibDType::kBf16   ? nibble::DType::kBF16
                             : t == nibble::CalibDType::kFp16 ? nibble::DType::kF16
                                                              : nibble::DType::kF32;
    std::unique_ptr<nibble::Linear> lin = nibble::MakeCalibLinear(n, k, w, b, t);
    std::vector<float> y(m * n);
    lin->Forward(x.data(), m, y.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = b[j], mag = std::fabs(b[j]);
        for (int64_t c = 0; c < k; ++c) {
          const double p = static_cast<double>(nibble::RoundToDType(x[i * k + c], dt)) *
                           nibble::RoundToDType((*w)[j * k + c], dt);
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[i * n + j], ref, mag * k * 0x1p-24) << nibble::CalibDTypeName(t) << " (" << i << ", " << j << ")";
      }
  }
}

}  // namespace
