// AWQ: calibration data, the sequential pipeline's numerical safety (fp16 overflow, all-zero
// channels and groups, GQA v->o skip), Quark scaling_layers from --quant_config, determinism
// (seed, thread count), and the acceptance checks on prose-llama-7m(-outliers) (mean KLD vs RTN).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include <nibble/nibble.h>
#include <nlohmann/json.hpp>

#include "formats/float_dtype.h"
#include "formats/quark_pack.h"
#include "io/safetensors.h"
#include "formats/checkpoint_format.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/ops.h"
#include "quantize/pipeline.h"
#include "quantize/algorithm.h"
#include "quantize/awq/awq.h"
#include "quantize/awq/search.h"
#include "quantize/calibrated.h"
#include "quantize/calibration.h"
#include "test_paths.h"
#include "test_util.h"
#include "tiny_llama.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;

std::string ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteText(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

using TinySpec = nibble_test::TinyLlamaSpec;
using nibble_test::WriteTinyModel;

using nibble_test::DirBytes;

std::string CalibFile(const TempDir& tmp) { return nibble_test::TinyCalibFile(tmp.sub("calib.txt")); }

nibble::QuantizeRequest AwqReq(const std::string& model, const std::string& out, const std::string& calib) {
  return nibble_test::TinyCalibRequest("awq", model, out, calib);
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

void ExpectModelRunsFinite(const std::string& dir) {
  auto m = nibble::Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto logits = (*m)->Logits({1, 50, 60, 70, 80, 90});
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  EXPECT_TRUE(AllFinite(*logits));
}

std::vector<float> TensorValues(const nibble::TensorStore& st, const std::string& name) {
  const nibble::TensorView* t = st.Find(name);
  EXPECT_NE(t, nullptr) << name;
  std::vector<float> v;
  if (t == nullptr) return v;
  const size_t es = nibble::DTypeSize(t->dtype);
  for (size_t i = 0; i < t->nbytes / es; ++i) v.push_back(nibble::LoadFloatAs(t->data + i * es, t->dtype));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Calibration data

TEST(AwqCalibration, FirstChunksShortfallWarningAndSeededShuffle) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  auto tok = nibble::Tokenizer::Load(nibble_test::SharedModel("stories260K"));
  ASSERT_TRUE(tok.ok());
  const std::string text = ReadAll(nibble_test::SharedData("tinyshakespeare.txt")).substr(0, 20000);
  auto all = (*tok)->Encode(text);
  ASSERT_TRUE(all.ok());
  auto d = nibble::BuildCalibrationData(**tok, {text}, 3, 100, 0);
  ASSERT_TRUE(d.ok()) << d.error().message;
  ASSERT_EQ(d->tokens.size(), 300u);
  EXPECT_EQ(std::vector<int32_t>(all->begin(), all->begin() + 300), d->tokens);  // [BOS] + encode(text), first chunks
  EXPECT_EQ(d->tokens[0], (*tok)->bos_id());
  EXPECT_TRUE(d->warnings.empty());
  // Ask for more than there is: a warning with the real count, not an error.
  const int64_t avail = static_cast<int64_t>(all->size()) / 100;
  auto many = nibble::BuildCalibrationData(**tok, {text}, 100000, 100, 0);
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(many->num_chunks, avail);
  ASSERT_EQ(many->warnings.size(), 1u);
  EXPECT_NE(many->warnings[0].find(std::to_string(avail) + " chunks"), std::string::npos) << many->warnings[0];
  // Seeded choice: deterministic, distinct chunks, differs from the first chunks.
  auto s1 = nibble::BuildCalibrationData(**tok, {text}, 3, 100, 5);
  auto s2 = nibble::BuildCalibrationData(**tok, {text}, 3, 100, 5);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s1->tokens, s2->tokens);
  EXPECT_NE(s1->tokens, d->tokens);
  // Too little text for one chunk: a named error.
  auto none = nibble::BuildCalibrationData(**tok, {"hi"}, 1, 100, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("fewer than one chunk"), std::string::npos);
}

// The shortfall warning of a run names the calibration file it counted.
TEST(AwqCalibration, ShortfallWarningOfARunNamesTheDataset) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  TempDir tmp;
  const std::string data = tmp.sub("short.txt");
  std::ofstream(data) << ReadAll(nibble_test::SharedData("prose-calib.txt")).substr(0, 3000);
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  r.quant_algo = "awq";
  r.dataset = data;
  r.num_calib_data = 1000;
  r.seq_len = 64;
  r.n_grid = 2;
  auto q = nibble::Quantize(r);
  ASSERT_TRUE(q.ok()) << q.error().message;
  bool named = false;
  for (const std::string& m : q->messages)
    named = named || (m.starts_with("warning: --dataset " + data + ": calibration data has ") &&
                      m.find("instead of the 1000 asked for") != std::string::npos);
  EXPECT_TRUE(named);
}

TEST(AwqCalibration, JsonlTextsAreConcatenatedAndLongDocumentsChunked) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  TempDir tmp;
  const std::string p = tmp.sub("c.jsonl");
  WriteText(p, "{\"text\": \"Once upon a time there was a little dog.\"}\n\n{\"text\": \"It was happy.\", \"id\": 3}\n");
  auto texts = nibble::ReadCalibrationTexts(p);
  ASSERT_TRUE(texts.ok()) << texts.error().message;
  ASSERT_EQ(texts->size(), 2u);
  auto tok = nibble::Tokenizer::Load(nibble_test::SharedModel("stories260K"));
  ASSERT_TRUE(tok.ok());
  auto a = (*tok)->Encode((*texts)[0]);
  auto b = (*tok)->Encode((*texts)[1]);
  auto d = nibble::BuildCalibrationData(**tok, *texts, 2, 5, 0);
  ASSERT_TRUE(d.ok());
  std::vector<int32_t> stream = *a;
  stream.insert(stream.end(), b->begin(), b->end());
  EXPECT_EQ(std::vector<int32_t>(stream.begin(), stream.begin() + 10), d->tokens);  // one document spans chunks
  WriteText(p, "{\"text\": 3}\n");
  auto bad = nibble::ReadCalibrationTexts(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(":1: expected a JSON object with a string field \"text\""), std::string::npos)
      << bad.error().message;
  WriteText(p, "not json\n");
  EXPECT_FALSE(nibble::ReadCalibrationTexts(p).ok());
}

// ---------------------------------------------------------------------------------------------
// AWQ numerical safety and GQA

TEST(Awq, GqaSkipsVToOWithMessageAndStillQuantizesAndRuns) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  WriteTinyModel(tmp.sub("m"), TinySpec{});
  auto req = AwqReq(tmp.sub("m"), tmp.sub("q"), CalibFile(tmp));
  std::vector<std::string> msgs;
  req.on_message = [&](const std::string& m) { msgs.push_back(m); };
  auto s = nibble::Quantize(req);
  ASSERT_TRUE(s.ok()) << s.error().message;
  bool said = false;
  for (const auto& m : msgs) said = said || (m.find("v_proj") != std::string::npos && m.find("skipped") != std::string::npos &&
                                             m.find("16") != std::string::npos && m.find("64") != std::string::npos);
  EXPECT_TRUE(said);
  auto cfg = nlohmann::json::parse(ReadAll(tmp.sub("q/config.json")));
  const auto& algo = cfg["quantization_config"]["algo_config"];
  ASSERT_TRUE(algo.is_array());
  ASSERT_EQ(algo.size(), 1u);
  EXPECT_EQ(algo[0]["name"], "awq");
  EXPECT_EQ(algo[0]["scaling_layers"].size(), 3u);  // v_proj -> o_proj left out
  for (const auto& m : algo[0]["scaling_layers"]) EXPECT_NE(m["prev_op"], "self_attn.v_proj");
  EXPECT_EQ(algo[0]["propagation"], "fp");
  ASSERT_EQ(s->calib_layers.size(), 2u);
  for (const auto& l : s->calib_layers) {
    ASSERT_EQ(l.mappings.size(), 4u);
    EXPECT_TRUE(l.mappings[1].skipped);
    for (const auto& m : l.mappings) {
      if (!m.skipped) {
        EXPECT_LE(m.loss_best, m.loss_rtn);  // identity is candidate 0
      }
    }
  }
  ExpectModelRunsFinite(tmp.sub("q"));
  // The report JSON carries the same.
  auto rep = nlohmann::json::parse(s->report_json);
  EXPECT_EQ(rep["calib_layers"].size(), 2u);
  EXPECT_EQ(rep["calibration"]["chunks"], 4);
}

TEST(Awq, Fp16OverflowAfterScalingNeverBecomesInf) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  TinySpec spec;
  spec.kv_heads = 8;  // MHA: v_proj -> o_proj runs too
  // Channel 5 carries large activations (norm weight 8) and q_proj has a 60000 weight there:
  // any scale > 1.09 on channel 5 pushes that group's range past fp16's 65504.
  WriteTinyModel(tmp.sub("m"), spec, [](const std::string& name, std::vector<float>& v) {
    if (name == "model.layers.0.input_layernorm.weight") v[5] = 8.0f;
    if (name == "model.layers.0.self_attn.q_proj.weight") v[0 * 64 + 5] = 60000.0f;
  });
  auto req = AwqReq(tmp.sub("m"), tmp.sub("q"), CalibFile(tmp));
  auto s = nibble::Quantize(req);
  ASSERT_TRUE(s.ok()) << s.error().message;
  int64_t rejected = 0;
  for (const auto& m : s->calib_layers[0].mappings) {
    rejected += m.rejected;
    if (!m.skipped) {
      EXPECT_TRUE(std::isfinite(m.loss_best));
      EXPECT_TRUE(std::isfinite(m.scale_max));
    }
  }
  EXPECT_GT(rejected, 0) << "candidates that overflow fp16 must be rejected";
  auto st = nibble::TensorStore::OpenDir(tmp.sub("q"));
  ASSERT_TRUE(st.ok());
  for (const auto& n : st->Names()) {
    const nibble::TensorView* t = st->Find(n);
    if (t->dtype == nibble::DType::kF16) {
      EXPECT_TRUE(AllFinite(TensorValues(*st, n))) << n;
    }
  }
  ExpectModelRunsFinite(tmp.sub("q"));
}

TEST(Awq, ZeroChannelAndZeroGroupAreFiniteAndExact) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  TinySpec spec;
  spec.dtype = nibble::DType::kBF16;
  // Channel 3: input_layernorm weight 0 (activations always 0) and q/k/v columns 0.
  // gate_proj row 0, group 0 (columns 0..31): all zero.
  WriteTinyModel(tmp.sub("m"), spec, [](const std::string& name, std::vector<float>& v) {
    if (name.find("input_layernorm") != std::string::npos) v[3] = 0.0f;
    if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos ||
        name.find("v_proj") != std::string::npos)
      for (size_t r = 0; r < v.size() / 64; ++r) v[r * 64 + 3] = 0.0f;
    if (name.find("gate_proj") != std::string::npos)
      for (int c = 0; c < 32; ++c) v[c] = 0.0f;
  });
  auto s = nibble::Quantize(AwqReq(tmp.sub("m"), tmp.sub("q"), CalibFile(tmp)));
  ASSERT_TRUE(s.ok()) << s.error().message;
  for (const auto& l : s->calib_layers)
    for (const auto& m : l.mappings) {
      if (m.skipped) continue;
      EXPECT_TRUE(std::isfinite(m.loss_best) && std::isfinite(m.loss_rtn));
      EXPECT_TRUE(std::isfinite(m.scale_min) && m.scale_min > 0 && std::isfinite(m.scale_max));
    }
  auto fmt = nibble::OpenCheckpointFormat(tmp.sub("q"));
  ASSERT_TRUE(fmt.ok() && *fmt != nullptr && (*fmt)->name() == "quark");
  auto st = nibble::TensorStore::OpenDir(tmp.sub("q"));
  ASSERT_TRUE(st.ok());
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.gate_proj";
    auto r = (*fmt)->Resolve(p);
    ASSERT_TRUE(r.ok() && r->spec);
    auto imported = (*fmt)->Import(*st, p, *r, 128, 64);
    ASSERT_TRUE(imported.ok()) << imported.error().message;
    ASSERT_TRUE(imported->has_value());
    const auto& q = *imported;
    std::vector<float> w(128 * 64);
    nibble::DequantizeRef(*q, w.data());
    for (int c = 0; c < 32; ++c) EXPECT_EQ(w[c], 0.0f);
    EXPECT_TRUE(AllFinite(q->scales));
    EXPECT_TRUE(AllFinite(TensorValues(*st, "model.layers." + std::to_string(l) + ".input_layernorm.weight")));
  }
  ExpectModelRunsFinite(tmp.sub("q"));
}

// ---------------------------------------------------------------------------------------------
// Config: custom scaling_layers from --quant_config; named errors.

TEST(Awq, QuantConfigScalingLayersAreUsedAndRecorded) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  WriteTinyModel(tmp.sub("m"), TinySpec{});
  nlohmann::ordered_json qc = {
      {"quant_method", "quark"},
      {"export", {{"kv_cache_group", nlohmann::json::array()}, {"min_kv_scale", 0.0}, {"pack_method", "reorder"},
                  {"weight_format", "real_quantized"}, {"weight_merge_groups", nullptr}}},
      {"global_quant_config", {{"input_tensors", nullptr}, {"output_tensors", nullptr}, {"bias", nullptr},
                               {"weight", {{"dtype", "int4"}, {"is_dynamic", false}, {"qscheme", "per_group"},
                                           {"ch_axis", 1}, {"group_size", 32}, {"symmetric", true},
                                           {"round_method", "half_even"}, {"scale_type", "float"}}}}},
      {"layer_quant_config", nlohmann::json::object()}, {"layer_type_quant_config", nlohmann::json::object()},
      {"kv_cache_quant_config", nlohmann::json::object()}, {"exclude", {"lm_head"}},
      {"algo_config", {{{"name", "awq"}, {"model_decoder_layers", "model.layers"},
                        {"scaling_layers", {{{"prev_op", "mlp.up_proj"}, {"layers", {"mlp.down_proj"}}, {"inp", "mlp.down_proj"}}}}}}},
      {"softmax_quant_spec", nullptr}, {"quant_mode", "eager_mode"}};
  WriteText(tmp.sub("qc.json"), qc.dump(2));
  auto req = AwqReq(tmp.sub("m"), tmp.sub("q"), CalibFile(tmp));
  req.quant_config_file = tmp.sub("qc.json");
  auto s = nibble::Quantize(req);
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->calib_layers[0].mappings.size(), 1u);
  auto cfg = nlohmann::json::parse(ReadAll(tmp.sub("q/config.json")));
  const auto& sl = cfg["quantization_config"]["algo_config"][0]["scaling_layers"];
  ASSERT_EQ(sl.size(), 1u);
  EXPECT_EQ(sl[0]["prev_op"], "mlp.up_proj");
  // input_layernorm is untouched (no mapping folds into it); up_proj rows and down columns are.
  auto in = nibble::TensorStore::OpenDir(tmp.sub("m"));
  auto out = nibble::TensorStore::OpenDir(tmp.sub("q"));
  ASSERT_TRUE(in.ok() && out.ok());
  EXPECT_EQ(TensorValues(*in, "model.layers.0.input_layernorm.weight"), TensorValues(*out, "model.layers.0.input_layernorm.weight"));

  // A mapping whose prev_op does not feed its layers is a named error.
  qc["algo_config"][0]["scaling_layers"][0]["prev_op"] = "input_layernorm";
  WriteText(tmp.sub("qc.json"), qc.dump(2));
  auto bad = nibble::Quantize(req);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("prev_op input_layernorm does not feed mlp.down_proj"), std::string::npos)
      << bad.error().message;
}

TEST(Awq, BadRequestsAreNamedErrors) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  WriteTinyModel(tmp.sub("m"), TinySpec{});
  auto req = AwqReq(tmp.sub("m"), tmp.sub("q"), "");
  auto r = nibble::Quantize(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("--dataset"), std::string::npos);
  req.dataset = CalibFile(tmp);
  req.propagate = "sideways";
  r = nibble::Quantize(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("--propagate"), std::string::npos);
  req.propagate = "fp";
  req.dataset = tmp.sub("missing.txt");
  r = nibble::Quantize(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("--dataset " + req.dataset + ": no such file"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().code, nibble::ErrorCode::kNotFound);
}

// The inputs of a direct AWQ run (RunAwq): a tiny model written to `dir`, its config and tensors, and
// a uint4 g32 Quark config.
struct TinyAwqInputs {
  std::optional<nibble::ModelConfig> mc;
  std::optional<nibble::TensorStore> store;
  nibble::QuarkQuantConfig cfg;
};

void OpenTinyAwqInputs(const std::string& dir, const TinySpec& spec, TinyAwqInputs* in) {
  WriteTinyModel(dir, spec, nullptr, /*tokenizer=*/false);  // RunAwq reads no tokenizer
  auto mc = nibble::LoadModelConfig(dir);
  ASSERT_TRUE(mc.ok()) << mc.error().message;
  auto store = nibble::TensorStore::OpenDir(dir);
  ASSERT_TRUE(store.ok()) << store.error().message;
  in->mc.emplace(std::move(mc).value());
  in->store.emplace(std::move(store).value());
  in->cfg.global = nibble::WeightQuantSpec{};
  in->cfg.global->group_size = 32;
}

// AWQ alone with settings `st` (its propagation too) on the pipeline, as quantize runs the chain
// "awq" through the registry, with fp32 calibration.
nibble::Result<nibble::CalibResult> RunAwq(const nibble::ModelConfig& mc, const nibble::TensorStore& store,
                                           const nibble::QuarkQuantConfig& cfg, const std::vector<int32_t>& tokens,
                                           int64_t batch, int64_t seq, const nibble::AwqSettings& st,
                                           const nibble::LayerTensorSink& sink,
                                           const std::function<void(int64_t, int64_t)>& progress) {
  NIBBLE_ASSIGN_OR_RETURN(auto chain, nibble::ParseAlgorithmChain("awq"));
  nibble::AlgorithmFlags flags;
  flags.awq = st;
  flags.propagation = st.propagation;
  // These tests compare fp32 formulas (e.g. the Gram loss against the direct one, to 1e-5);
  // 16-bit calibration has its own tests (calib_dtype_test.cc).
  flags.calib_dtype = nibble::CalibDType::kFp32;
  NIBBLE_ASSIGN_OR_RETURN(nibble::AlgorithmPlan algos, nibble::ResolveAlgorithms(chain, flags, nullptr));
  return nibble::RunCalibrated(mc, store, cfg, algos, tokens, batch, seq, sink, progress, nullptr);
}

// batch × seq calibration token ids for the tiny model (vocab 512), deterministic.
std::vector<int32_t> TinyTokens(int64_t batch, int64_t seq) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < batch * seq; ++i) tokens.push_back(static_cast<int32_t>(3 + (i * 37 + i / 7) % 500));
  return tokens;
}

// AWQ twice on `in` (TinyTokens(batch, seq)): default settings with set(st, false), then with
// set(st, true). Both runs must succeed and hand the sink the same tensor names with bit-identical
// values (`what` names the switch in a failure); their reports land in *off and *on.
void RunOffOnSameTensors(const TinyAwqInputs& in, int64_t batch, int64_t seq,
                         const std::function<void(nibble::AwqSettings&, bool)>& set, const std::string& what,
                         std::optional<nibble::CalibResult>* off, std::optional<nibble::CalibResult>* on) {
  const std::vector<int32_t> tokens = TinyTokens(batch, seq);
  std::map<std::string, std::vector<float>> tensors[2];
  for (int k = 0; k < 2; ++k) {
    nibble::AwqSettings st;
    set(st, k == 1);
    std::map<std::string, std::vector<float>>* out = &tensors[k];
    auto sink = [out](nibble::LayerTensor t) -> nibble::Status {
      (*out)[t.name] = std::move(t.values);
      return nibble::Status::Ok();
    };
    auto r = RunAwq(*in.mc, *in.store, in.cfg, tokens, batch, seq, st, sink, nullptr);
    ASSERT_TRUE(r.ok()) << what << ": " << r.error().message;
    (k == 0 ? off : on)->emplace(std::move(r).value());
  }
  ASSERT_EQ(tensors[0].size(), tensors[1].size());
  for (const auto& [name, v] : tensors[0]) {
    ASSERT_TRUE(tensors[1].count(name)) << name;
    EXPECT_TRUE(v == tensors[1].at(name)) << name << " differs " << what;
  }
}

// Bounded memory: RunAwq hands each layer's tensors to the sink as soon as that layer is done
// (after its mappings, before the next layer starts) and keeps none of them; a sink error stops
// the pipeline at once and is returned.
TEST(Awq, EachLayerGoesToTheSinkWhenDoneAndSinkErrorsStopThePipeline) {
  TempDir tmp;
  TinySpec spec;
  spec.layers = 3;
  TinyAwqInputs in;
  ASSERT_NO_FATAL_FAILURE(OpenTinyAwqInputs(tmp.sub("m"), spec, &in));
  const nibble::ModelConfig& mc = *in.mc;
  const nibble::TensorStore& store = *in.store;
  const nibble::QuarkQuantConfig& cfg = in.cfg;
  const int64_t batch = 2, seq = 32;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < batch * seq; ++i) tokens.push_back(static_cast<int32_t>(3 + (i * 37) % 500));
  const nibble::AwqSettings st;
  const int64_t per_layer = static_cast<int64_t>(st.scaling_layers.size()) + 1;  // mappings + propagation
  int64_t step = 0;
  auto progress = [&](int64_t done, int64_t total) {
    step = done;
    EXPECT_EQ(total, 3 * per_layer);
  };
  struct Call {
    std::string name;
    int64_t step;
    size_t size;
  };
  std::vector<Call> calls;
  auto sink = [&](nibble::LayerTensor t) -> nibble::Status {
    calls.push_back({t.name, step, t.values.size()});
    return nibble::Status::Ok();
  };
  auto r = RunAwq(mc, store, cfg, tokens, batch, seq, st, sink, progress);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<std::string> order = {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                                          "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
  ASSERT_EQ(calls.size(), 3 * order.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const int64_t l = static_cast<int64_t>(i / order.size());
    const std::string name = "model.layers." + std::to_string(l) + "." + order[i % order.size()] + ".weight";
    EXPECT_EQ(calls[i].name, name);
    // All of layer l's mapping steps are done, its final step (and layer l+1) not yet.
    EXPECT_EQ(calls[i].step, l * per_layer + per_layer - 1) << name;
    const nibble::TensorView* t = store.Find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(calls[i].size, t->nbytes / nibble::DTypeSize(t->dtype)) << name;
  }

  calls.clear();
  step = 0;
  auto failing = [&](nibble::LayerTensor t) -> nibble::Status {
    const std::string& name = t.name;
    calls.push_back({name, step, 0});
    if (name == "model.layers.1.self_attn.q_proj.weight") return nibble::MakeError("cannot write ", name, ": disk full");
    return nibble::Status::Ok();
  };
  r = RunAwq(mc, store, cfg, tokens, batch, seq, st, failing, progress);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("disk full"), std::string::npos) << r.error().message;
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().name, "model.layers.1.self_attn.q_proj.weight");  // nothing after the error
  EXPECT_EQ(step, 2 * per_layer - 1);                                       // layer 2 never started
}

// The calibration pipeline runs the layer the model runs: on a one-layer Qwen3-shaped model
// (per-head q_norm / k_norm, head_dim 16 while hidden / heads is 8, tied embeddings), the fp pass's
// layer output, final-normed and projected on the embedding, gives LlamaModel's logits for each
// calibration sequence. A pipeline that skipped the q/k norms would differ by whole units.
class CaptureLayerOutput : public nibble::LayerAlgorithm {
 public:
  nibble::Status Finish(const nibble::LayerRunner& runner, nibble::CalibLayer&, nibble::LayerCodes&,
                        const std::function<nibble::Status()>&) override {
    out = runner.acts().out;
    return nibble::Status::Ok();
  }
  std::vector<float> out;
};

TEST(Awq, Qwen3CalibrationForwardIsTheModelForward) {
  TempDir tmp;
  TinySpec spec;
  spec.model_type = "qwen3";
  spec.architecture = "Qwen3ForCausalLM";
  spec.layers = 1;
  spec.heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 16;
  spec.write_head_dim = true;
  spec.qk_norm = true;
  spec.tie = true;
  TinyAwqInputs in;
  ASSERT_NO_FATAL_FAILURE(OpenTinyAwqInputs(tmp.sub("m"), spec, &in));
  const nibble::ModelConfig& mc = *in.mc;
  ASSERT_TRUE(mc.qk_norm);
  const int64_t batch = 2, seq = 24, h = mc.hidden_size, v = mc.vocab_size;
  const std::vector<int32_t> tokens = TinyTokens(batch, seq);
  CaptureLayerOutput cap;
  auto r = nibble::RunLayerPipeline(mc, *in.store, in.cfg, tokens, batch, seq, cap, nibble::PipelineOptions{},
                                    [](nibble::LayerTensor) { return nibble::Status::Ok(); });
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(cap.out.size(), static_cast<size_t>(batch * seq * h));
  auto model = nibble::LlamaModel::Load(tmp.sub("m"));
  ASSERT_TRUE(model.ok()) << model.error().message;
  const std::vector<float> norm = TensorValues(*in.store, "model.norm.weight");
  const std::vector<float> emb = TensorValues(*in.store, "model.embed_tokens.weight");
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<float> want(static_cast<size_t>(seq * v));
    nibble::KvCache cache = (*model)->NewCache(seq).value();
    ASSERT_TRUE((*model)->Forward(tokens.data() + b * seq, seq, cache, want.data(), true).ok());
    std::vector<float> xn(static_cast<size_t>(seq * h));
    nibble::RmsNorm(cap.out.data() + b * seq * h, norm.data(), seq, h, mc.rms_norm_eps, xn.data());
    double worst = 0, scale = 1;
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t j = 0; j < v; ++j) {
        double got = 0;
        for (int64_t i = 0; i < h; ++i) got += static_cast<double>(xn[t * h + i]) * emb[j * h + i];
        worst = std::max(worst, std::fabs(got - want[t * v + j]));
        scale = std::max(scale, std::fabs(got));
      }
    // Same fp32 code on both sides but for the last GEMM's order: a few hundred ulps of the
    // logit scale at most.
    EXPECT_LE(worst, 1e-4 * scale) << "sequence " << b;
  }
}

// The early stop of losing grid candidates changes no result: the same scales, losses and output
// tensors as the full search, with candidates actually stopped (several inspect chunks per call:
// 256 sequences of 32 tokens are 4 chunks of 2048 rows).
TEST(Awq, EarlyStopGivesTheFullSearchResult) {
  TempDir tmp;
  TinySpec spec;
  TinyAwqInputs in;
  ASSERT_NO_FATAL_FAILURE(OpenTinyAwqInputs(tmp.sub("m"), spec, &in));
  std::optional<nibble::CalibResult> full, fast;
  ASSERT_NO_FATAL_FAILURE(RunOffOnSameTensors(
      in, 256, 32,
      [](nibble::AwqSettings& st, bool on) {
        st.duo_scaling = nibble::DuoScaling::kBoth;
        st.early_stop = on;
      },
      "with the early stop", &full, &fast));
  int64_t stopped = 0;
  ASSERT_EQ(full->layers.size(), fast->layers.size());
  for (size_t l = 0; l < full->layers.size(); ++l) {
    ASSERT_EQ(full->layers[l].mappings.size(), fast->layers[l].mappings.size());
    for (size_t m = 0; m < full->layers[l].mappings.size(); ++m) {
      const auto& a = full->layers[l].mappings[m];
      const auto& b = fast->layers[l].mappings[m];
      if (a.skipped) continue;
      EXPECT_EQ(a.ratio, b.ratio);
      EXPECT_EQ(a.duo, b.duo);
      EXPECT_EQ(a.loss_rtn, b.loss_rtn);
      EXPECT_EQ(a.loss_best, b.loss_best);
      EXPECT_EQ(a.rejected, b.rejected);
      EXPECT_EQ(a.stopped_early, 0);
      stopped += b.stopped_early;
    }
  }
  EXPECT_GT(stopped, 0) << "no grid candidate was stopped early";
}

// The Gram-matrix loss of a single inspected linear (up_proj -> down_proj here; v_proj -> o_proj
// too without GQA) against the direct MSE of X·Ŵᵀ per candidate: the same losses to rounding and
// the same choices, so the same output bytes.
TEST(Awq, GramLossOfOneLinearEqualsTheDirectLoss) {
  TempDir tmp;
  TinySpec spec;
  spec.kv_heads = spec.heads;  // v_proj -> o_proj runs too
  TinyAwqInputs in;
  ASSERT_NO_FATAL_FAILURE(OpenTinyAwqInputs(tmp.sub("m"), spec, &in));
  std::optional<nibble::CalibResult> direct, gram;
  ASSERT_NO_FATAL_FAILURE(RunOffOnSameTensors(
      in, 64, 32,
      [](nibble::AwqSettings& st, bool on) {
        st.duo_scaling = nibble::DuoScaling::kBoth;
        st.gram_linear_loss = on;
      },
      "with the Gram loss", &direct, &gram));
  int64_t linear_mappings = 0;
  for (size_t l = 0; l < direct->layers.size(); ++l)
    for (size_t m = 0; m < direct->layers[l].mappings.size(); ++m) {
      const auto& a = direct->layers[l].mappings[m];
      const auto& b = gram->layers[l].mappings[m];
      ASSERT_FALSE(a.skipped) << a.mapping.prev_op;
      EXPECT_EQ(a.ratio, b.ratio);
      EXPECT_EQ(a.duo, b.duo);
      EXPECT_NEAR(b.loss_rtn, a.loss_rtn, 1e-5 * a.loss_rtn);
      EXPECT_NEAR(b.loss_best, a.loss_best, 1e-5 * a.loss_best);
      if (a.mapping.prev_op == "mlp.up_proj" || a.mapping.prev_op == "self_attn.v_proj") {
        ++linear_mappings;
        EXPECT_GT(a.loss_rtn, 0.0);
        EXPECT_GT(a.loss_rtn, a.loss_best * (1 + 1e-4)) << "AWQ should beat RTN on the inspected linear";
      }
    }
  EXPECT_EQ(linear_mappings, 2 * static_cast<int64_t>(direct->layers.size()));
}

// Which loss a single inspected linear gets: fp32 calibration always the Gram matrix; a 16-bit
// one its candidate forward below 2K rows (bf16) or K rows (fp16), where that costs less; none
// with gram_linear_loss off.
TEST(Awq, GramLossOnlyWhereItIsCheaperThanTheCandidateForward) {
  nibble::AwqSettings st;
  const int64_t k = 4096;
  for (int64_t rows : {int64_t{1}, int64_t{2048}, int64_t{16384}, int64_t{1} << 20})
    EXPECT_TRUE(nibble::AwqGramLoss(st, nibble::CalibDType::kFp32, rows, k)) << rows;
  EXPECT_FALSE(nibble::AwqGramLoss(st, nibble::CalibDType::kBf16, 2 * k - 1, k));
  EXPECT_TRUE(nibble::AwqGramLoss(st, nibble::CalibDType::kBf16, 2 * k, k));
  EXPECT_FALSE(nibble::AwqGramLoss(st, nibble::CalibDType::kFp16, k - 1, k));
  EXPECT_TRUE(nibble::AwqGramLoss(st, nibble::CalibDType::kFp16, k, k));
  st.gram_linear_loss = false;
  EXPECT_FALSE(nibble::AwqGramLoss(st, nibble::CalibDType::kFp32, 1 << 20, k));
}

// Reusing a layer's attention stages across mappings gives the bytes of recomputing them, with
// the default mappings and with an order where a mapping that rescales the attention (input_layernorm
// -> q/k/v) comes between two that need the MLP stages.
TEST(Awq, ReusedAttentionStagesGiveTheBytesOfRecomputingThem) {
  TempDir tmp;
  TinySpec spec;
  spec.kv_heads = spec.heads;  // v_proj -> o_proj runs too
  TinyAwqInputs in;
  ASSERT_NO_FATAL_FAILURE(OpenTinyAwqInputs(tmp.sub("m"), spec, &in));
  const auto defaults = nibble::DefaultLlamaScalingLayers();
  const std::vector<nibble::AwqMapping> reordered = {defaults[2], defaults[0], defaults[3], defaults[1]};
  for (const auto& layers : {defaults, reordered}) {
    std::optional<nibble::CalibResult> fresh, reused;
    ASSERT_NO_FATAL_FAILURE(RunOffOnSameTensors(
        in, 32, 32,
        [&layers](nibble::AwqSettings& st, bool on) {
          st.scaling_layers = layers;
          st.reuse_attention = on;
        },
        "with reused attention stages", &fresh, &reused));
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism

TEST(Awq, SameSeedGivesByteIdenticalFilesWithOneAndTwoThreads) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
  TempDir tmp;
  WriteTinyModel(tmp.sub("m"), TinySpec{});
  const std::string calib = CalibFile(tmp);
  auto req = AwqReq(tmp.sub("m"), tmp.sub("a"), calib);
  req.seed = 3;
  req.awq_clip = true;
  req.propagate = "quantized";
  nibble::SetNumThreads(1);
  ASSERT_TRUE(nibble::Quantize(req).ok());
  req.output_dir = tmp.sub("b");
  ASSERT_TRUE(nibble::Quantize(req).ok());
  nibble::SetNumThreads(2);
  req.output_dir = tmp.sub("c");
  ASSERT_TRUE(nibble::Quantize(req).ok());
  nibble::SetNumThreads(0);
  const auto a = DirBytes(tmp.sub("a")), b = DirBytes(tmp.sub("b")), c = DirBytes(tmp.sub("c"));
  EXPECT_EQ(a.size(), 4u);  // model.safetensors, config.json, tokenizer.model, README.md (the model card note)
  EXPECT_TRUE(a == b) << "two runs with the same seed differ";
  EXPECT_TRUE(a == c) << "1 and 2 threads differ";
  auto cfg = nlohmann::json::parse(a.at("config.json"));
  EXPECT_EQ(cfg["quantization_config"]["algo_config"][0]["propagation"], "quantized");
  EXPECT_EQ(cfg["quantization_config"]["algo_config"][0]["clip"], true);
}

// ---------------------------------------------------------------------------------------------
// Acceptance (issue 4) on the shipped reference models, 32 x 512 calibration tokens (the
// reference implementation's setting), evaluation on prose-val, 60 windows of 512.

struct Kld {
  double rtn = 0, awq = 0, rtn_top1 = 0, awq_top1 = 0;
};

Kld RtnVsAwq(const std::string& model, const std::string& scheme) {
  TempDir tmp;
  nibble::QuantizeRequest r;
  r.model_dir = model;
  r.quant_scheme = scheme;
  r.group_size = 128;
  r.output_dir = tmp.sub("rtn");
  EXPECT_TRUE(nibble::Quantize(r).ok());
  r.output_dir = tmp.sub("awq");
  r.quant_algo = "awq";
  r.dataset = nibble_test::SharedData("prose-calib.txt");
  r.num_calib_data = 32;
  r.seq_len = 512;
  auto s = nibble::Quantize(r);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  nibble::LoadOptions lo;
  lo.kv_dtype = nibble::KvDtype::kFp32;  // the thresholds measure the weights, not the KV cache
  auto fp = nibble::Model::Load(model, lo);
  auto rtn = nibble::Model::Load(tmp.sub("rtn"), lo);
  auto awq = nibble::Model::Load(tmp.sub("awq"), lo);
  EXPECT_TRUE(fp.ok() && rtn.ok() && awq.ok());
  nibble::CompareOptions o;
  o.seq_len = 512;
  o.max_windows = 60;
  auto c = nibble::CompareModels(**fp, {rtn->get(), awq->get()}, ReadAll(nibble_test::SharedData("prose-val.txt")), o);
  EXPECT_TRUE(c.ok());
  Kld k{c->rows[0].mean_kld, c->rows[1].mean_kld, c->rows[0].top1_agreement, c->rows[1].top1_agreement};
  std::printf("%s %s: RTN KLD %.6f top-1 %.2f%% PPL %.3f | AWQ KLD %.6f top-1 %.2f%% PPL %.3f | AWQ %.1f s\n", model.c_str(),
              scheme.c_str(), k.rtn, 100 * k.rtn_top1, c->rows[0].perplexity.ppl, k.awq, 100 * k.awq_top1,
              c->rows[1].perplexity.ppl, s.ok() ? s->calib_seconds : -1.0);
  return k;
}

TEST(AwqAcceptance, OutliersAsymKldAtMost30PercentOfRtn) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m-outliers", "data/prose-calib.txt", "data/prose-val.txt");
  const Kld k = RtnVsAwq(nibble_test::SharedModel("prose-llama-7m-outliers"), "w_uint4_per_group_asym");
  EXPECT_NEAR(k.rtn, 0.0200, 0.0200 * 0.05);  // README band for RTN
  EXPECT_LE(k.awq, 0.30 * k.rtn);
}

TEST(AwqAcceptance, PlainModelAsymNotWorseThanRtn) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m", "data/prose-calib.txt", "data/prose-val.txt");
  const Kld k = RtnVsAwq(nibble_test::SharedModel("prose-llama-7m"), "w_uint4_per_group_asym");
  EXPECT_LE(k.awq, 1.05 * k.rtn);
}

TEST(AwqAcceptance, OutliersSymAndPlainSym) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m-outliers", "models/prose-llama-7m", "data/prose-calib.txt",
                      "data/prose-val.txt");
  const Kld a = RtnVsAwq(nibble_test::SharedModel("prose-llama-7m-outliers"), "w_int4_per_group_sym");
  EXPECT_LE(a.awq, 0.30 * a.rtn);
  const Kld b = RtnVsAwq(nibble_test::SharedModel("prose-llama-7m"), "w_int4_per_group_sym");
  EXPECT_LE(b.awq, 1.05 * b.rtn);
}

// stories260K against the reference implementation's table (stories260K/README.md: calibration
// the first 64 chunks of 256 tokens of tinyshakespeare, WikiText-2 test, 40 windows of 512,
// lm_head / embeddings not quantized; "g32" = group 32 with down_proj per-channel, K = 172).
// The asymmetric results agree to every printed digit; this checks they stay within 1 %. The
// symmetric ones sit on rounding ties (README "AWQ", measured 1.1-1.5 % off the reference) and
// are only held to the model's noise band, 5 %.
double Stories260KPerplexity(const std::string& scheme, int64_t group_size, const std::string& algo) {
  TempDir tmp;
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::SharedModel("stories260K");
  r.output_dir = tmp.sub("q");
  r.quant_scheme = scheme;
  r.group_size = group_size;
  if (group_size > 0)
    r.layer_quant_config = {std::string("*.down_proj:quant_scheme=") +
                            (scheme.find("uint4") != std::string::npos ? "w_uint4_per_channel_asym" : "w_int4_per_channel_sym")};
  r.quant_algo = algo;
  r.dataset = nibble_test::SharedData("tinyshakespeare.txt");
  r.num_calib_data = 64;
  r.seq_len = 256;
  auto s = nibble::Quantize(r);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  auto m = nibble::Model::Load(tmp.sub("q"));
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return 0;
  nibble::PerplexityOptions o;
  o.seq_len = 512;
  o.max_windows = 40;
  auto p = nibble::EvaluatePerplexity(**m, ReadAll(nibble_test::SharedData("wikitext-2-raw-test.txt")), o);
  EXPECT_TRUE(p.ok());
  return p.ok() ? p->ppl : 0;
}

TEST(AwqAcceptance, Stories260KAgreesWithTheReferenceImplementation) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt", "data/wikitext-2-raw-test.txt");
  EXPECT_NEAR(Stories260KPerplexity("w_uint4_per_channel_asym", -1, "rtn"), 138.02, 138.02 * 0.01);
  EXPECT_NEAR(Stories260KPerplexity("w_uint4_per_channel_asym", -1, "awq"), 143.30, 143.30 * 0.01);
  EXPECT_NEAR(Stories260KPerplexity("w_uint4_per_group_asym", 32, "rtn"), 144.86, 144.86 * 0.01);
  EXPECT_NEAR(Stories260KPerplexity("w_uint4_per_group_asym", 32, "awq"), 136.41, 136.41 * 0.01);
  EXPECT_NEAR(Stories260KPerplexity("w_int4_per_channel_sym", -1, "rtn"), 158.06, 158.06 * 0.01);
  EXPECT_NEAR(Stories260KPerplexity("w_int4_per_channel_sym", -1, "awq"), 161.18, 161.18 * 0.05);
  EXPECT_NEAR(Stories260KPerplexity("w_int4_per_group_sym", 32, "rtn"), 156.85, 156.85 * 0.01);
  EXPECT_NEAR(Stories260KPerplexity("w_int4_per_group_sym", 32, "awq"), 136.05, 136.05 * 0.05);
}

}  // namespace
