// The output projection of tied and untied models through quantize, load and verify: for every
// (tie_word_embeddings) × (lm_head.weight stored equal to the embedding / different / absent) ×
// (lm_head kept float / quantized) the export must be the model Transformers defines: tied → the
// embedding is the output projection, whatever lm_head.weight holds. The reference is built here
// from that rule alone: an untied checkpoint whose lm_head.weight is the projection Transformers
// would run, exported with the same flags; the two exports must compute bit-identical logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "test_util.h"
#include "tiny_llama.h"

namespace {

enum class Head { kEqual, kDifferent, kAbsent };
const char* HeadName(Head h) { return h == Head::kEqual ? "equal" : h == Head::kDifferent ? "different" : "absent"; }

// The checkpoint of one combination. `projection_only`: the reference instead, untied, with
// lm_head.weight = the projection Transformers runs for the combination (the embedding when tied).
// Every tensor is drawn in the same order either way, so both get the same values.
void WriteCase(const std::string& dir, bool tied, Head head, bool projection_only) {
  nibble_test::TinyLlamaSpec s;
  s.dtype = nibble::DType::kBF16;
  s.extra = {{"tie_word_embeddings", tied && !projection_only}};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> embedding;
  auto fill = [&](const nibble_test::TinyTensor& t, std::vector<float>& v) {
    using R = nibble_test::TinyRole;
    const float stddev = t.role == R::kEmbedding ? 0.3f : t.role == R::kNorm ? 0.05f : 0.1f;
    for (float& x : v) x = (t.role == R::kNorm ? 1.0f : 0.0f) + stddev * nd(rng);
    if (t.name == "model.embed_tokens.weight") embedding = v;
    if (t.name == "lm_head.weight" && (head == Head::kEqual || (projection_only && tied))) v = embedding;
  };
  std::vector<nibble::TensorToWrite> ts = TinyLlamaTensors(s, nibble_test::TinyOrder::kNormsFirst, fill);
  if (head == Head::kAbsent && !projection_only)
    std::erase_if(ts, [](const nibble::TensorToWrite& t) { return t.name == "lm_head.weight"; });
  nibble_test::WriteTinyLlama(dir, nibble_test::TinyLlamaConfig(s), ts, nibble_test::SharedModel("stories260K"));
}

nibble::QuantizeRequest Request(const std::string& in, const std::string& out, bool quantize_head) {
  nibble::QuantizeRequest r;
  r.model_dir = in;
  r.output_dir = out;
  r.quant_scheme = "w_uint4_per_group_asym";
  r.group_size = 32;
  if (quantize_head) r.layer_quant_config = {"lm_head:group_size=32"};
  return r;
}

std::vector<float> HeadLogits(const std::string& dir, std::vector<std::string>* warnings = nullptr) {
  auto m = nibble::Model::Load(dir);
  EXPECT_TRUE(m.ok()) << dir << ": " << m.error().message;
  if (!m.ok()) return {};
  if (warnings != nullptr) *warnings = (*m)->info().warnings;
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 48; ++i) ids.push_back((i * 37 + 5) % 512);
  auto l = (*m)->Logits(ids);
  EXPECT_TRUE(l.ok()) << l.error().message;
  return l.ok() ? *l : std::vector<float>{};
}

// Share of positions whose argmax agrees, and the relative RMS difference ||a - b|| / ||b||.
std::pair<double, double> Agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  const int64_t rows = static_cast<int64_t>(a.size()) / vocab;
  int64_t same = 0;
  double diff = 0, norm = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    same += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
    for (int64_t i = 0; i < vocab; ++i) {
      diff += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      norm += static_cast<double>(y[i]) * y[i];
    }
  }
  return {static_cast<double>(same) / static_cast<double>(rows), std::sqrt(diff / norm)};
}

nlohmann::json Config(const std::string& dir) { return nlohmann::json::parse(std::ifstream(dir + "/config.json")); }

TEST(TiedHead, EveryCombinationExportsTheModelTransformersRuns) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  nibble_test::TempDir tmp;
  for (bool tied : {true, false}) {
    for (Head head : {Head::kEqual, Head::kDifferent, Head::kAbsent}) {
      const std::string name = std::string(tied ? "tied-" : "untied-") + HeadName(head);
      SCOPED_TRACE(name);
      const std::string in = tmp.sub(name), ref = tmp.sub(name + "-ref");
      WriteCase(in, tied, head, false);
      if (!tied && head == Head::kAbsent) {  // no output projection at all
        auto s = nibble::Quantize(Request(in, tmp.sub(name + "-q"), false));
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.error().message.find("no lm_head tensor (the output projection) is stored"), std::string::npos)
            << s.error().message;
        EXPECT_NE(s.error().message.find("tie_word_embeddings"), std::string::npos) << s.error().message;
        auto m = nibble::Model::Load(in);
        ASSERT_FALSE(m.ok());
        EXPECT_NE(m.error().message.find("no lm_head tensor"), std::string::npos) << m.error().message;
        continue;
      }
      WriteCase(ref, tied, head, true);
      // The float model: nibble's forward runs the projection Transformers runs.
      std::vector<std::string> warnings;
      const std::vector<float> fp = HeadLogits(in, &warnings), fp_ref = HeadLogits(ref);
      ASSERT_FALSE(fp.empty());
      EXPECT_EQ(fp, fp_ref);
      const bool ignored = tied && head == Head::kDifferent;
      EXPECT_EQ(std::count_if(warnings.begin(), warnings.end(),
                              [](const std::string& w) { return w.find("uses model.embed_tokens.weight") != std::string::npos; }),
                ignored ? 1 : 0);
      for (bool quantize_head : {false, true}) {
        SCOPED_TRACE(quantize_head ? "lm_head quantized" : "lm_head float");
        const std::string q = tmp.sub(name + (quantize_head ? "-qh" : "-qf")), qref = q + "-ref";
        auto s = nibble::Quantize(Request(in, q, quantize_head));
        ASSERT_TRUE(s.ok()) << s.error().message;
        ASSERT_TRUE(nibble::Quantize(Request(ref, qref, quantize_head)).ok());
        std::string messages;
        for (const std::string& m : s->messages) messages += m + "\n";
        EXPECT_EQ(messages.find("matched no layer"), std::string::npos) << messages;
        EXPECT_EQ(messages.find("quantized from model.embed_tokens.weight and written untied") != std::string::npos,
                  tied && quantize_head) << messages;
        const auto head_layer = std::find_if(s->layers.begin(), s->layers.end(), [](const auto& l) { return l.name == "lm_head"; });
        if (quantize_head) {
          ASSERT_NE(head_layer, s->layers.end());
          EXPECT_TRUE(head_layer->quantized);
        }
        const nlohmann::json cfg = Config(q);
        EXPECT_EQ(cfg["tie_word_embeddings"].get<bool>(), tied && !quantize_head) << cfg.dump();
        // The export against the reference export: the same model, bit for bit.
        const std::vector<float> lq = HeadLogits(q), lref = HeadLogits(qref);
        ASSERT_FALSE(lq.empty());
        EXPECT_EQ(lq, lref);
        auto v = nibble::Verify({q, qref});
        ASSERT_TRUE(v.ok()) << v.error().message;
        for (const auto& e : v->entries) EXPECT_TRUE(e.identical) << e.name << ": " << e.a << " vs " << e.b;
        // And against the float model: int4 (g32, random weights) moves the logits by a fraction of
        // their size; another projection (a head built from the ignored lm_head.weight) would agree
        // on ~1/vocab of the tokens and differ by more than the logits themselves.
        const auto [top1, rel] = Agreement(lq, fp, 512);
        std::printf("%-18s %-17s top-1 agreement with float %.3f, relative RMS logit difference %.3f\n", name.c_str(),
                    quantize_head ? "lm_head quantized" : "lm_head float", top1, rel);
        EXPECT_GE(top1, 0.7);
        EXPECT_LT(rel, 0.3);
      }
    }
  }
}

// The calibrated export (AWQ on the sequential pipeline) builds a tied head from the embedding as
// the RTN export does: AWQ never touches lm_head, so both write the same codes.
TEST(TiedHead, CalibratedExportQuantizesTheEmbeddingAsHead) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  nibble_test::TempDir tmp;
  const std::string in = tmp.sub("tied-different"), rtn = tmp.sub("rtn"), awq = tmp.sub("awq");
  WriteCase(in, true, Head::kDifferent, false);
  ASSERT_TRUE(nibble::Quantize(Request(in, rtn, true)).ok());
  nibble::QuantizeRequest r = nibble_test::TinyCalibRequest("awq", in, awq, nibble_test::TinyCalibFile(tmp.sub("calib.txt")));
  r.layer_quant_config = {"lm_head:group_size=32"};
  auto s = nibble::Quantize(r);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_FALSE(Config(awq)["tie_word_embeddings"].get<bool>());
  auto v = nibble::Verify({rtn, awq});
  ASSERT_TRUE(v.ok()) << v.error().message;
  int64_t heads = 0;
  for (const auto& e : v->entries) {
    if (e.name != "lm_head") continue;
    ++heads;
    EXPECT_TRUE(e.identical) << e.a << " vs " << e.b;
    EXPECT_EQ(e.a, "uint4 per_group g32") << e.a;  // quantized, not the float embedding
  }
  EXPECT_EQ(heads, 1);
  // Against the float model (whose lm_head is the embedding): within half a quantization step.
  // The stored lm_head.weight, N(0, 0.1²) against the embedding's N(0, 0.3²), is far from it.
  v = nibble::Verify({in, awq});
  ASSERT_TRUE(v.ok()) << v.error().message;
  for (const auto& e : v->entries) {
    if (e.name != "lm_head") continue;
    EXPECT_FALSE(e.identical);
    EXPECT_LT(e.max_abs_diff, 0.1) << e.a << " vs " << e.b;
  }
}

// A checkpoint whose config says tied while it stores a quantized lm_head runs the embedding, as
// Transformers and vLLM do, and says the stored head is ignored.
TEST(TiedHead, StoredQuantizedHeadOfATiedConfigIsIgnored) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  nibble_test::TempDir tmp;
  const std::string in = tmp.sub("tied-absent"), qf = tmp.sub("qf"), qh = tmp.sub("qh");
  WriteCase(in, true, Head::kAbsent, false);
  ASSERT_TRUE(nibble::Quantize(Request(in, qf, false)).ok());
  ASSERT_TRUE(nibble::Quantize(Request(in, qh, true)).ok());
  nlohmann::json cfg = Config(qh);
  cfg["tie_word_embeddings"] = true;
  std::ofstream(qh + "/config.json") << cfg.dump(2);
  std::vector<std::string> warnings;
  EXPECT_EQ(HeadLogits(qh, &warnings), HeadLogits(qf));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("lm_head is stored quantized: nibble uses model.embed_tokens.weight"), std::string::npos)
      << warnings[0];
}

}  // namespace
