// The model families of bench/configs/*-tiny.json (Llama 3, Qwen3, Mistral, Qwen2.5 configs scaled
// down in hidden size, layers and heads, with their real vocabularies, rope settings, biases,
// q/k norms and sliding window) end to end through the CLI: `nibble synth` writes each with the
// embedded model's tokenizer, then perplexity and generation run on it, and for the Llama-3- and
// Qwen3-shaped ones RTN and AWQ quantize to Quark, reload and run again.
//
// The weights are synth's U(-0.035, 0.035): the logits are nearly flat, so the float perplexity
// sits just above the vocabulary size, and int4 moves it by well under 1 %. The forward itself is
// checked against an independent oracle in tests/model/reference_forward_test.cc; here the checks
// are that every path runs, reads what synth wrote, and gives the numbers those facts imply.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "e2e/run_nibble.h"
#include "io/safetensors.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

using nibble_test::ParsePerplexity;
using nibble_test::Quote;
using nibble_test::RunNibble;
using nibble_test::RunResult;

struct FamilyCase {
  std::string config;  // bench/configs/<config>.json
  int64_t vocab;
  bool tied, qk_norm, qkv_bias;
};

double FamilyPerplexity(const std::string& model) {
  const RunResult r = RunNibble("perplexity --model " + Quote(model) + " --text " +
                                Quote(nibble_test::SharedData("prose-val.txt")) + " --seq_len 128 --max_windows 2");
  EXPECT_EQ(r.exit_code, 0) << model << ": " << r.out;
  return ParsePerplexity(r.out);
}

void ExpectGenerates(const std::string& model) {
  const RunResult r = RunNibble("generate --model " + Quote(model) + " -n 6 --temperature 0 --prompt 'Once upon a time'");
  EXPECT_EQ(r.exit_code, 0) << model << ": " << r.out;
  EXPECT_NE(r.out.find("decode: "), std::string::npos) << r.out;
}

// The tensors synth wrote are the ones the config implies.
void ExpectFamilyTensors(const std::string& dir, const FamilyCase& c) {
  auto store = nibble::TensorStore::OpenDir(dir);
  ASSERT_TRUE(store.ok()) << store.error().message;
  const nibble::TensorView* emb = store->Find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape[0], c.vocab) << c.config;
  EXPECT_EQ(store->Find("lm_head.weight") == nullptr, c.tied) << c.config;
  EXPECT_EQ(store->Find("model.layers.1.self_attn.q_norm.weight") != nullptr, c.qk_norm) << c.config;
  EXPECT_EQ(store->Find("model.layers.1.self_attn.k_proj.bias") != nullptr, c.qkv_bias) << c.config;
}

TEST(ModelFamilies, SynthConfigsRunEndToEnd) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt", "data/prose-calib.txt");
  nibble_test::TempDir dir("nibble_families_");
  const std::vector<FamilyCase> cases = {{"llama3-tiny", 128256, false, false, false},
                                         {"qwen3-tiny", 151936, true, true, false},
                                         {"mistral-tiny", 32000, false, false, false},  // window 64 < 128 tokens
                                         {"qwen2.5-tiny", 151936, true, false, true}};
  for (const FamilyCase& c : cases) {
    const std::string model = dir.sub(c.config);
    RunResult r = RunNibble("synth --config " + Quote(nibble_test::SourceDir() + "/bench/configs/" + c.config + ".json") +
                            " --out " + Quote(model) + " --format dense --tokenizer_dir " +
                            Quote(nibble_test::EmbeddedModel()));
    ASSERT_EQ(r.exit_code, 0) << c.config << ": " << r.out;
    ExpectFamilyTensors(model, c);
    const double fp = FamilyPerplexity(model);
    std::printf("%-14s float perplexity %.1f (vocab %lld)\n", c.config.c_str(), fp, static_cast<long long>(c.vocab));
    // Near-flat logits over the whole vocabulary: perplexity within a few % of its size.
    EXPECT_GT(fp, 0.9 * static_cast<double>(c.vocab)) << c.config;
    EXPECT_LT(fp, 1.1 * static_cast<double>(c.vocab)) << c.config;
    ExpectGenerates(model);
    if (c.config != "llama3-tiny" && c.config != "qwen3-tiny") continue;
    for (const std::string algo : {"rtn", "awq"}) {
      const std::string q = model + "-" + algo;
      std::string flags = "--quant_scheme w_uint4_per_group_asym --group_size 32 --quant_algo " + algo;
      if (algo == "awq")
        flags += " --dataset " + Quote(nibble_test::SharedData("prose-calib.txt")) + " --num_calib_data 4 --seq_len 64";
      r = RunNibble("quantize --model_dir " + Quote(model) + " --output_dir " + Quote(q) + " " + flags);
      ASSERT_EQ(r.exit_code, 0) << c.config << " " << algo << ": " << r.out;
      // 2 layers x 7 linears; an untied lm_head stays float, as nibble quantize's default.
      EXPECT_NE(r.out.find(c.tied ? "quantized 14 of 14 linear layers" : "quantized 14 of 15 linear layers"),
                std::string::npos)
          << r.out;
      const double pq = FamilyPerplexity(q);
      std::printf("%-14s %s perplexity %.1f (%+.3f %%)\n", c.config.c_str(), algo.c_str(), pq, 100.0 * (pq / fp - 1.0));
      EXPECT_NEAR(pq, fp, 0.01 * fp) << c.config << " " << algo;
      EXPECT_NE(pq, fp) << c.config << " " << algo << ": the quantized model is the float one";
      ExpectGenerates(q);
      if (!c.qk_norm) continue;
      // q_norm / k_norm are no linears: exported as stored.
      auto in = nibble::TensorStore::OpenDir(model);
      auto out = nibble::TensorStore::OpenDir(q);
      ASSERT_TRUE(in.ok() && out.ok());
      for (const char* name : {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"}) {
        const nibble::TensorView *a = in->Find(name), *b = out->Find(name);
        ASSERT_NE(b, nullptr) << name;
        EXPECT_EQ(a->dtype, b->dtype) << name;
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data), a->nbytes),
                  std::string(reinterpret_cast<const char*>(b->data), b->nbytes))
            << name;
      }
    }
  }
}

// A tokenizer dir without tokenizer.model or tokenizer.json is refused before anything is written;
// ONNX export refuses Qwen3 by name.
TEST(ModelFamilies, RefusalsNameWhatIsMissing) {
  nibble_test::TempDir dir("nibble_families_bad_");
  const std::string cfg = Quote(nibble_test::SourceDir() + "/bench/configs/qwen3-tiny.json");
  RunResult r = RunNibble("synth --config " + cfg + " --out " + Quote(dir.sub("m")) + " --tokenizer_dir " +
                          Quote(dir.path()));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("no tokenizer.model or tokenizer.json"), std::string::npos) << r.out;
  r = RunNibble("synth --config " + cfg + " --out " + Quote(dir.sub("m")) + " --tokenizer_dir " +
                Quote(nibble_test::EmbeddedModel()));  // Quark uint4 g128 RTN
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = RunNibble("export-onnx --model " + Quote(dir.sub("m")) + " --out " + Quote(dir.sub("m.onnx")));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("q_norm / k_norm"), std::string::npos) << r.out;
}

}  // namespace
