// Quantize -> export -> load on the shipped models: every layer's dequantized weights after
// loading the exported Quark checkpoint are bit-identical to the RTN reference computed in memory
// from the original weights; configs, shards, odd shapes and mismatches behave as documented.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <filesystem>
#include <random>

#include <nibble/nibble.h>

#include "formats/int4_matrix.h"
#include "formats/quark_pack.h"
#include "formats/rtn.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "formats/checkpoint_format.h"
#include "formats/quark_format.h"
#include "model/model_loader.h"
#include "model/int4_linear.h"
#include "model/weights.h"
#include "test_paths.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;

std::vector<const nibble::Linear*> AllLinears(const nibble::LlamaModel& m) {
  std::vector<const nibble::Linear*> v;
  for (const auto& l : m.layers())
    for (const nibble::Linear* p : {l.q_proj.get(), l.k_proj.get(), l.v_proj.get(), l.o_proj.get(), l.gate_proj.get(),
                                    l.up_proj.get(), l.down_proj.get()})
      v.push_back(p);
  v.push_back(&m.lm_head());
  return v;
}

// Quantizes `model_dir` with `req`, loads the result, and compares every layer with the in-memory
// RTN reference for the spec the written config resolves to.
void CheckRoundTrip(const std::string& model_dir, nibble::QuantizeRequest req, int expect_quantized_min) {
  TempDir tmp;
  req.model_dir = model_dir;
  req.output_dir = tmp.sub("out");
  auto summary = nibble::Quantize(req);
  ASSERT_TRUE(summary.ok()) << summary.error().message;

  nibble::LoadReport report;
  auto loaded = nibble::LoadAnyModel(req.output_dir, &report);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  ASSERT_EQ(report.format_name, "quark");
  auto fmt = nibble::OpenCheckpointFormat(req.output_dir);
  ASSERT_TRUE(fmt.ok() && *fmt != nullptr);
  auto src = nibble::TensorStore::OpenDir(model_dir);
  ASSERT_TRUE(src.ok());
  auto mc = nibble::LoadModelConfig(model_dir);
  ASSERT_TRUE(mc.ok());
  const auto names = nibble::LinearModuleNames(*mc, src->Find("lm_head.weight") != nullptr);
  const auto linears = AllLinears(**loaded);
  int quantized = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    auto r = (*fmt)->Resolve(name);
    ASSERT_TRUE(r.ok());
    const nibble::TensorView* w = src->Find(name + ".weight");
    ASSERT_NE(w, nullptr) << name;
    auto wf = nibble::TensorToF32(*w);
    ASSERT_TRUE(wf.ok());
    const auto* q = dynamic_cast<const nibble::Int4Linear*>(linears[i]);
    if (!r->spec) {
      EXPECT_EQ(q, nullptr) << name << " should be float (" << r->rule << ")";
      continue;
    }
    ASSERT_NE(q, nullptr) << name << " should be int4 (" << r->rule << ")";
    ++quantized;
    auto ref = nibble::QuantizeRtnRef(wf->data(), w->shape[0], w->shape[1], *r->spec, w->dtype);
    ASSERT_TRUE(ref.ok()) << name << ": " << ref.error().message;
    std::vector<float> a(wf->size()), b(wf->size());
    nibble::DequantizeRef(*ref, a.data());
    nibble::DequantizeRef(q->weight(), b.data());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << name << " dequantized weights differ";
    EXPECT_EQ(*ref, q->weight()) << name;
  }
  EXPECT_GE(quantized, expect_quantized_min);
}

nibble::QuantizeRequest Req(const std::string& scheme, int64_t g, const std::string& pack) {
  nibble::QuantizeRequest r;
  r.quant_scheme = scheme;
  r.group_size = g;
  r.pack_method = pack;
  return r;
}

TEST(QuarkRoundTrip, ProseLlamaAllSchemesAndPackMethods) {
  const std::string m = nibble_test::EmbeddedModel();
  for (const char* pack : {"reorder", "order"}) {
    CheckRoundTrip(m, Req("w_uint4_per_group_asym", 128, pack), 42);
    CheckRoundTrip(m, Req("w_int4_per_group_sym", 32, pack), 42);
  }
  CheckRoundTrip(m, Req("w_uint4_per_channel_asym", 128, "reorder"), 42);
  CheckRoundTrip(m, Req("w_int4_per_channel_sym", 128, "order"), 42);
  auto all = Req("w_uint4_per_group_asym", 64, "reorder");
  all.exclude_layers.clear();  // lm_head quantized too
  CheckRoundTrip(m, all, 43);
}

TEST(QuarkRoundTrip, Stories260KMisalignedDownProjAndPaddedOutputs) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  // K = 172 for down_proj: g32 needs a policy; gate/up have N = 172 (not a multiple of 8: padded).
  const std::string m = nibble_test::SharedModel("stories260K");
  auto r = Req("w_uint4_per_group_asym", 32, "reorder");
  r.misaligned = "per_channel";
  CheckRoundTrip(m, r, 35);
  r.misaligned = "exclude";
  CheckRoundTrip(m, r, 30);
  auto s = Req("w_int4_per_group_sym", 32, "order");
  s.misaligned = "per_channel";
  CheckRoundTrip(m, s, 35);
}

TEST(QuarkExport, MisalignedIsAnErrorByDefault) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  TempDir tmp;
  auto r = Req("w_uint4_per_group_asym", 32, "reorder");
  r.model_dir = nibble_test::SharedModel("stories260K");
  r.output_dir = tmp.sub("out");
  auto s = nibble::Quantize(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("model.layers.0.mlp.down_proj"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("K = 172"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("group_size 32"), std::string::npos) << s.error().message;
  EXPECT_FALSE(fs::exists(r.output_dir));
}

TEST(QuarkExport, PolicyIsRecordedInWrittenConfig) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  TempDir tmp;
  auto r = Req("w_uint4_per_group_asym", 32, "reorder");
  r.model_dir = nibble_test::SharedModel("stories260K");
  r.output_dir = tmp.sub("out");
  r.misaligned = "exclude";
  ASSERT_TRUE(nibble::Quantize(r).ok());
  auto cfg = nibble::ReadJsonFile(r.output_dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  const auto& ex = (*cfg)["quantization_config"]["exclude"];
  EXPECT_NE(std::find(ex.begin(), ex.end(), "model.layers.4.mlp.down_proj"), ex.end()) << ex.dump();
}

// The summary says the --misaligned policy decided (not one per-layer override per module).
TEST(QuarkExport, SummaryNamesTheMisalignedPolicy) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  for (const char* policy : {"per_channel", "exclude"}) {
    TempDir tmp;
    auto r = Req("w_uint4_per_group_asym", 32, "reorder");
    r.model_dir = nibble_test::SharedModel("stories260K");
    r.output_dir = tmp.sub("out");
    r.misaligned = policy;
    auto s = nibble::Quantize(r);
    ASSERT_TRUE(s.ok()) << s.error().message;
    int64_t by_policy = 0;
    for (const auto& l : s->layers) {
      if (l.name.find("down_proj") == std::string::npos) continue;
      EXPECT_EQ(l.rule.rfind(std::string(policy) == "exclude" ? "excluded by --misaligned exclude" : "--misaligned per_channel", 0), 0u)
          << l.name << ": " << l.rule;
      EXPECT_NE(l.rule.find("group_size 32"), std::string::npos) << l.rule;
      EXPECT_EQ(l.quantized, std::string(policy) == "per_channel") << l.name;
      ++by_policy;
    }
    EXPECT_EQ(by_policy, 5) << policy;  // stories260K: 5 layers, K = 172 in down_proj
  }
}

TEST(QuarkExport, ConfigJsonKeepsModelConfigAndHasFullQuarkSchema) {
  TempDir tmp;
  auto r = Req("w_int4_per_group_sym", 128, "order");
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  ASSERT_TRUE(nibble::Quantize(r).ok());
  auto cfg = nibble::ReadJsonFile(r.output_dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ((*cfg)["hidden_size"], 256);
  EXPECT_EQ((*cfg)["torch_dtype"], "bfloat16");
  const auto& q = (*cfg)["quantization_config"];
  EXPECT_EQ(q["quant_method"], "quark");
  EXPECT_EQ(q["export"]["pack_method"], "order");
  EXPECT_EQ(q["export"]["weight_format"], "real_quantized");
  EXPECT_TRUE(q["export"].contains("kv_cache_group"));
  EXPECT_TRUE(q["export"].contains("min_kv_scale"));
  EXPECT_TRUE(q["export"].contains("weight_merge_groups"));
  for (const char* k : {"global_quant_config", "layer_quant_config", "layer_type_quant_config", "exclude", "algo_config", "quant_mode"})
    EXPECT_TRUE(q.contains(k)) << k;
  const auto& w = q["global_quant_config"]["weight"];
  EXPECT_EQ(w["dtype"], "int4");
  EXPECT_EQ(w["symmetric"], true);
  EXPECT_EQ(w["group_size"], 128);
  EXPECT_EQ(w["qscheme"], "per_group");
  EXPECT_TRUE(q["global_quant_config"]["input_tensors"].is_null());
  // Tensors: transposed packed weight, bf16 scales, int32 zero points (all zero for int4).
  auto st = nibble::TensorStore::OpenDir(r.output_dir);
  ASSERT_TRUE(st.ok());
  const auto* qw = st->Find("model.layers.0.mlp.down_proj.weight");
  const auto* sc = st->Find("model.layers.0.mlp.down_proj.weight_scale");
  const auto* zp = st->Find("model.layers.0.mlp.down_proj.weight_zero_point");
  ASSERT_TRUE(qw && sc && zp);
  EXPECT_EQ(qw->dtype, nibble::DType::kI32);
  EXPECT_EQ(qw->shape, (std::vector<int64_t>{768, 32}));  // [K, N/8]
  EXPECT_EQ(sc->dtype, nibble::DType::kBF16);
  EXPECT_EQ(sc->shape, (std::vector<int64_t>{6, 256}));  // [K/g, N]
  EXPECT_EQ(zp->shape, (std::vector<int64_t>{6, 32}));
  for (size_t i = 0; i < zp->nbytes; ++i) ASSERT_EQ(zp->data[i], 0) << "int4 zero point byte " << i;
  // Untouched tensors are copied byte for byte in their dtype.
  auto in = nibble::TensorStore::OpenDir(r.model_dir);
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.3.input_layernorm.weight"}) {
    const auto* a = in->Find(name);
    const auto* b = st->Find(name);
    ASSERT_TRUE(a && b) << name;
    EXPECT_EQ(a->dtype, b->dtype) << name;
    EXPECT_EQ(a->shape, b->shape) << name;
    EXPECT_EQ(0, std::memcmp(a->data, b->data, a->nbytes)) << name;
  }
  EXPECT_TRUE(fs::exists(r.output_dir + "/tokenizer.model"));
  EXPECT_TRUE(fs::exists(r.output_dir + "/tokenizer_config.json"));
}

TEST(QuarkExport, ShardedOutputLoadsToSameLogits) {
  TempDir tmp;
  auto r = Req("w_uint4_per_group_asym", 64, "reorder");
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("single");
  ASSERT_TRUE(nibble::Quantize(r).ok());
  r.output_dir = tmp.sub("sharded");
  r.max_shard_size = 1000000;
  auto s = nibble::Quantize(r);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_GT(s->shards, 3);
  EXPECT_TRUE(fs::exists(r.output_dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(r.output_dir + "/model-00001-of-0000" + std::to_string(s->shards) + ".safetensors"));
  EXPECT_FALSE(fs::exists(r.output_dir + "/model.safetensors"));
  auto a = nibble::Model::Load(tmp.sub("single"));
  auto b = nibble::Model::Load(tmp.sub("sharded"));
  ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b.error().message : a.error().message);
  const std::vector<int32_t> ids = {1, 1567, 336, 668, 262, 761};
  EXPECT_EQ(*(*a)->Logits(ids), *(*b)->Logits(ids));
}

TEST(QuarkExport, ExistingOutputNeedsOverwrite) {
  TempDir tmp;
  auto r = Req("w_uint4_per_group_asym", 128, "reorder");
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  fs::create_directory(r.output_dir);
  auto s = nibble::Quantize(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("--overwrite"), std::string::npos);
  r.overwrite = true;
  ASSERT_TRUE(nibble::Quantize(r).ok());
  EXPECT_TRUE(fs::exists(r.output_dir + "/model.safetensors"));
  for (const auto& e : fs::directory_iterator(tmp.path()))  // no staging leftovers
    EXPECT_EQ(e.path().filename().string().find(".nibble-"), std::string::npos) << e.path();
}

TEST(QuarkExport, QuantConfigFileIsAppliedAsWritten) {
  TempDir tmp;
  const std::string cfg = R"({
    "quant_method": "quark",
    "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "order", "weight_format": "real_quantized", "weight_merge_groups": null},
    "global_quant_config": {"input_tensors": null, "output_tensors": null, "bias": null, "target_device": null,
      "weight": {"dtype": "uint4", "is_dynamic": false, "qscheme": "per_group", "ch_axis": 1, "group_size": 128,
                 "symmetric": false, "round_method": "half_even", "scale_type": "float", "observer_cls": "PerGroupMinMaxObserver"}},
    "layer_quant_config": {"*down_proj": {"input_tensors": null, "output_tensors": null, "bias": null, "target_device": null,
      "weight": {"dtype": "int4", "is_dynamic": false, "qscheme": "per_group", "ch_axis": 1, "group_size": 32,
                 "symmetric": true, "round_method": "half_even", "scale_type": "float", "observer_cls": "PerGroupMinMaxObserver"}}},
    "layer_type_quant_config": {}, "kv_cache_quant_config": {},
    "exclude": ["lm_head", "re:model\\.layers\\.5\\..*"], "algo_config": null, "softmax_quant_spec": null, "quant_mode": "eager_mode"})";
  const std::string path = tmp.sub("qc.json");
  FILE* f = fopen(path.c_str(), "w");
  fputs(cfg.c_str(), f);
  fclose(f);
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  r.quant_config_file = path;
  auto s = nibble::Quantize(r);
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto rep = nibble::Inspect(r.output_dir);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_EQ(rep->format_properties, (std::vector<std::pair<std::string, std::string>>{{"pack_method", "order"}}));
  for (const auto& l : rep->layers) {
    if (l.name == "lm_head" || l.name.rfind("model.layers.5.", 0) == 0) {
      EXPECT_FALSE(l.quantized) << l.name;
      EXPECT_NE(l.rule.find("excluded"), std::string::npos) << l.name << ": " << l.rule;
    } else if (l.name.find("down_proj") != std::string::npos) {
      EXPECT_EQ(l.scheme, "int4 per_group g32") << l.name;
      EXPECT_EQ(l.rule, "layer_quant_config[\"" + l.name + "\"]") << l.name;  // written by exact name
    } else {
      EXPECT_EQ(l.scheme, "uint4 per_group g128") << l.name;
      EXPECT_EQ(l.rule, "global_quant_config") << l.name;
    }
  }
  CheckRoundTrip(nibble_test::EmbeddedModel(), r, 30);
}

// Rewrites one tensor of an exported checkpoint (single file) through a callback.
void RewriteTensor(const std::string& dir, const std::string& name,
                   const std::function<void(nibble::TensorToWrite&)>& edit) {
  std::vector<nibble::TensorToWrite> tensors;
  {
    auto st = nibble::TensorStore::OpenDir(dir);
    ASSERT_TRUE(st.ok());
    for (const auto& n : st->Names()) {
      const auto* t = st->Find(n);
      nibble::TensorToWrite w{t->name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)};
      if (n == name) edit(w);
      tensors.push_back(std::move(w));
    }
  }
  std::vector<const nibble::TensorToWrite*> ptrs;
  for (const auto& t : tensors) ptrs.push_back(&t);
  ASSERT_TRUE(nibble::WriteSafetensors(dir + "/model.safetensors", ptrs, {}).ok());
}

TEST(QuarkImport, MismatchesAreNamedErrors) {
  TempDir tmp;
  auto r = Req("w_int4_per_group_sym", 128, "reorder");
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  ASSERT_TRUE(nibble::Quantize(r).ok());
  const std::string dir = r.output_dir;
  struct Case {
    const char* what;
    std::string tensor;
    std::function<void(nibble::TensorToWrite&)> edit;
    std::string expect;
  };
  const std::string p = "model.layers.1.self_attn.q_proj";
  const Case cases[] = {
      {"float weight where config says quantized", p + ".weight",
       [](nibble::TensorToWrite& t) { t.dtype = nibble::DType::kF32; t.shape = {256, 32}; }, p},
      {"weight shape contradicts config", p + ".weight",
       [](nibble::TensorToWrite& t) { t.shape = {128, 64}; }, p + ".weight"},
      {"non-zero int4 zero point", p + ".weight_zero_point",
       [](nibble::TensorToWrite& t) { t.bytes[0] = 0x3; }, "zero point"},
      {"scale dtype int", p + ".weight_scale",
       [](nibble::TensorToWrite& t) { t.dtype = nibble::DType::kI16; }, p + ".weight_scale"},
      {"packed weight on excluded lm_head", "lm_head.weight",
       [](nibble::TensorToWrite& t) { t.dtype = nibble::DType::kI32; t.shape = {4096, 128}; t.bytes.resize(4096 * 128 * 4); }, "lm_head"},
  };
  for (const auto& c : cases) {
    TempDir d;
    fs::copy(dir, d.sub("m"), fs::copy_options::recursive);
    RewriteTensor(d.sub("m"), c.tensor, c.edit);
    auto m = nibble::Model::Load(d.sub("m"));
    ASSERT_FALSE(m.ok()) << c.what;
    EXPECT_NE(m.error().message.find(c.expect), std::string::npos) << c.what << ": " << m.error().message;
  }
}

// A Quark config with global g128 and layer_quant_config {"lm_head": g32}: lm_head of a
// Llama-7B-sized head (hidden 4096, vocab 32000) loads with group size 32, 128 groups per row.
TEST(QuarkImport, LayerQuantConfigGivesLmHeadGroup32) {
  nibble::QuarkQuantConfig cfg;
  nibble::WeightQuantSpec g128;
  g128.group_size = 128;
  nibble::WeightQuantSpec g32 = g128;
  g32.group_size = 32;
  cfg.global = g128;
  cfg.layer_quant_config.push_back({"lm_head", g32});
  const int64_t n = 32000, k = 4096;
  nibble::Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = 32;
  m.codes.resize(n * k);
  m.scales.assign(n * (k / 32), 0.015625f);
  m.zero_points.assign(n * (k / 32), 8);
  std::mt19937 rng(5);
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng() & 15);
  auto t = nibble::ExportQuarkLinear("lm_head", m, g32, nibble::PackMethod::kReorder, nibble::DType::kBF16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->weight_scale.shape, (std::vector<int64_t>{128, 32000}));
  auto bytes = nibble::SerializeSafetensors({&t->weight, &t->weight_scale, &t->weight_zero_point}, {});
  ASSERT_TRUE(bytes.ok());
  TempDir tmp;
  const std::string file = tmp.sub("model.safetensors");
  FILE* f = fopen(file.c_str(), "wb");
  fwrite(bytes->data(), 1, bytes->size(), f);
  fclose(f);
  auto store = nibble::TensorStore::OpenFiles({file});
  ASSERT_TRUE(store.ok());
  auto lin = nibble::MakeLinearLoader(nibble::MakeQuarkFormat(cfg))(*store, "lm_head", n, k, false);
  ASSERT_TRUE(lin.ok()) << lin.error().message;
  const auto* q = dynamic_cast<const nibble::Int4Linear*>(lin->get());
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->weight().group_size, 32);
  EXPECT_EQ(q->weight().groups(), 128);
  EXPECT_EQ(q->weight().codes, m.codes);
  // Under the global g128 spec the same tensors are rejected with a shape error.
  nibble::QuarkQuantConfig global_only = cfg;
  global_only.layer_quant_config.clear();
  auto bad = nibble::MakeLinearLoader(nibble::MakeQuarkFormat(global_only))(*store, "lm_head", n, k, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("lm_head.weight_scale"), std::string::npos) << bad.error().message;
}

TEST(QuarkModel, PerplexityWithinReadmeBand) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  // prose-llama-7m README: RTN uint4 asym g128 62.995, RTN int4 sym g128 62.735 (first 60 windows
  // of 512), band ±0.5 %.
  std::ifstream in(nibble_test::SharedData("prose-val.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::pair<const char*, double> cases[] = {{"w_uint4_per_group_asym", 62.995}, {"w_int4_per_group_sym", 62.735}};
  for (const auto& [scheme, ref] : cases) {
    TempDir tmp;
    auto r = Req(scheme, 128, "reorder");
    r.model_dir = nibble_test::EmbeddedModel();
    r.output_dir = tmp.sub("out");
    ASSERT_TRUE(nibble::Quantize(r).ok());
    auto m = nibble::Model::Load(r.output_dir);
    ASSERT_TRUE(m.ok()) << m.error().message;
    nibble::PerplexityOptions opt;
    opt.seq_len = 512;
    opt.max_windows = 60;
    auto p = nibble::EvaluatePerplexity(**m, ss.str(), opt);
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_NEAR(p->ppl, ref, ref * 0.005) << scheme;
  }
}

}  // namespace
