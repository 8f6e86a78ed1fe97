// compressed-tensors pack-quantized: SPEC TV-1 words both ways, config parsing and resolution,
// refusals, the engines report against an independent model of vLLM's rule, and a quantize
// export that loads to the same Int4Matrix per linear as the hf_format export.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include <nibble/quantize.h>

#include "formats/checkpoint_format.h"
#include "formats/compressed_tensors_config.h"
#include "formats/compressed_tensors_engines.h"
#include "formats/compressed_tensors_format.h"
#include "formats/float_dtype.h"
#include "formats/quark_format.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "test_paths.h"
#include "test_util.h"

namespace nibble {
namespace {

using OJ = nlohmann::ordered_json;
using nibble_test::TempDir;

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
#define EXPECT_HAS(text, part) EXPECT_TRUE(Has(text, part)) << "missing \"" << (part) << "\" in: " << (text)

// SPEC TV-1: the 2 × 16 weight at group size 8, asymmetric.
Int4Matrix Tv1() {
  Int4Matrix m;
  m.n = 2;
  m.k = 16;
  m.group_size = 8;
  m.codes = {0, 1, 2, 4, 6, 8, 12, 15, 2, 4, 6, 8, 10, 12, 14, 15, 0, 2, 4, 6, 8, 10, 12, 15, 0, 3, 7, 11, 15, 14, 13, 9};
  m.scales = {0.25f, 0.25f, 0.25f, 0.25f};
  m.zero_points = {4, 0, 8, 15};
  return m;
}

QuantSpec Spec(bool sym, int64_t g) {
  QuantSpec q;
  q.symmetric = sym;
  q.group_size = g;
  return q;
}

std::vector<uint32_t> WordsOf(const TensorToWrite& t) {
  std::vector<uint32_t> w(t.bytes.size() / 4);
  std::memcpy(w.data(), t.bytes.data(), t.bytes.size());
  return w;
}

const TensorToWrite* Named(const std::vector<TensorToWrite>& ts, const std::string& suffix) {
  for (const auto& t : ts)
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) return &t;
  return nullptr;
}

// Writes `ts` into one safetensors file under `dir` and opens it.
TensorStore StoreOf(const TempDir& dir, const std::vector<TensorToWrite>& ts) {
  std::vector<const TensorToWrite*> ptrs;
  for (const auto& t : ts) ptrs.push_back(&t);
  const std::string path = dir.sub("model.safetensors");
  EXPECT_TRUE(WriteSafetensors(path, ptrs, {{"format", "pt"}}).ok());
  auto s = TensorStore::OpenFiles({path});
  EXPECT_TRUE(s.ok());
  return std::move(s).value();
}

const std::string kP = "model.layers.0.mlp.down_proj";

TEST(CompressedTensorsFormat, Tv1WordsExport) {
  auto ts = ExportCtLinear(kP, Tv1(), Spec(false, 8), DType::kF16);
  ASSERT_TRUE(ts.ok()) << ts.error().message;
  const TensorToWrite* packed = Named(*ts, ".weight_packed");
  const TensorToWrite* zero = Named(*ts, ".weight_zero_point");
  const TensorToWrite* scale = Named(*ts, ".weight_scale");
  const TensorToWrite* shape = Named(*ts, ".weight_shape");
  ASSERT_TRUE(packed && zero && scale && shape);
  EXPECT_EQ(packed->dtype, DType::kI32);
  EXPECT_EQ(packed->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(WordsOf(*packed), (std::vector<uint32_t>{0xFC864210u, 0xFECA8642u, 0xFCA86420u, 0x9DEFB730u}));
  EXPECT_EQ(zero->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(WordsOf(*zero), (std::vector<uint32_t>{0x84u, 0xF0u}));
  EXPECT_EQ(scale->dtype, DType::kF16);
  EXPECT_EQ(scale->shape, (std::vector<int64_t>{2, 2}));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(LoadFloatAs(scale->bytes.data() + 2 * i, DType::kF16), 0.25f);
  EXPECT_EQ(shape->dtype, DType::kI64);
  int64_t nk[2];
  std::memcpy(nk, shape->bytes.data(), 16);
  EXPECT_EQ(nk[0], 2);
  EXPECT_EQ(nk[1], 16);
  EXPECT_EQ(Named(*ts, ".weight_g_idx"), nullptr);
}

// The TV-1 words written by hand (not by the exporter) import to TV-1's matrix.
std::vector<TensorToWrite> Tv1Tensors() {
  auto words = [](const std::string& name, std::vector<int64_t> shape, std::vector<uint32_t> w) {
    TensorToWrite t{name, DType::kI32, std::move(shape), std::vector<uint8_t>(w.size() * 4)};
    std::memcpy(t.bytes.data(), w.data(), t.bytes.size());
    return t;
  };
  std::vector<TensorToWrite> ts;
  ts.push_back(words(kP + ".weight_packed", {2, 2}, {0xFC864210u, 0xFECA8642u, 0xFCA86420u, 0x9DEFB730u}));
  ts.push_back(words(kP + ".weight_zero_point", {1, 2}, {0x84u, 0xF0u}));
  TensorToWrite s{kP + ".weight_scale", DType::kBF16, {2, 2}, std::vector<uint8_t>(8)};
  for (int i = 0; i < 4; ++i) StoreFloatAs(0.25f, DType::kBF16, s.bytes.data() + 2 * i);
  ts.push_back(std::move(s));
  TensorToWrite shape{kP + ".weight_shape", DType::kI32, {2}, std::vector<uint8_t>(8)};
  const int32_t nk[2] = {2, 16};
  std::memcpy(shape.bytes.data(), nk, 8);
  ts.push_back(std::move(shape));
  return ts;
}

TEST(CompressedTensorsFormat, Tv1WordsImport) {
  TempDir dir;
  TensorStore store = StoreOf(dir, Tv1Tensors());
  auto m = ImportCtLinear(store, kP, Spec(false, 8), 2, 16);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE(*m == Tv1());
}

TEST(CompressedTensorsFormat, SymmetricStoresNoZeroPointAndRefusesOne) {
  std::mt19937 rng(3);
  Int4Matrix m;
  m.n = 12;  // not a multiple of 8: the last zero-point word would be padded
  m.k = 64;
  m.group_size = 32;
  m.symmetric = true;
  for (int i = 0; i < 12 * 64; ++i) m.codes.push_back(static_cast<uint8_t>(rng() % 16));
  for (int i = 0; i < 24; ++i) m.scales.push_back(0.0078125f * static_cast<float>(1 + rng() % 8));
  m.zero_points.assign(24, 8);
  auto ts = ExportCtLinear(kP, m, Spec(true, 32), DType::kBF16);
  ASSERT_TRUE(ts.ok()) << ts.error().message;
  EXPECT_EQ(Named(*ts, ".weight_zero_point"), nullptr);
  {
    TempDir dir;
    auto back = ImportCtLinear(StoreOf(dir, *ts), kP, Spec(true, 32), 12, 64);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_TRUE(*back == m);
  }
  // The same tensors plus a zero point: outside the format (SPEC §9.3).
  Int4Matrix asym = m;
  asym.symmetric = false;
  auto with_zero = ExportCtLinear(kP, asym, Spec(false, 32), DType::kBF16);
  ASSERT_TRUE(with_zero.ok());
  TempDir dir;
  auto bad = ImportCtLinear(StoreOf(dir, *with_zero), kP, Spec(true, 32), 12, 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.error().message, "tensor " + kP + ".weight_zero_point");
  EXPECT_HAS(bad.error().message, "symmetric, which stores no zero point");
  EXPECT_HAS(bad.error().message, dir.sub("model.safetensors"));
}

TEST(CompressedTensorsFormat, GIdxIsWrittenAndReadBack) {
  Int4Matrix m = Tv1();
  m.g_idx = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
  auto ts = ExportCtLinear(kP, m, Spec(false, 8), DType::kF32);
  ASSERT_TRUE(ts.ok()) << ts.error().message;
  ASSERT_NE(Named(*ts, ".weight_g_idx"), nullptr);
  QuantSpec act = Spec(false, 8);
  act.act_order = true;
  TempDir dir;
  TensorStore store = StoreOf(dir, *ts);
  auto back = ImportCtLinear(store, kP, act, 2, 16);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_TRUE(*back == m);
  // Without actorder "group" a non-natural g_idx is refused (vLLM would ignore it).
  auto plain = ImportCtLinear(store, kP, Spec(false, 8), 2, 16);
  ASSERT_FALSE(plain.ok());
  EXPECT_HAS(plain.error().message, "needs the config's actorder \"group\"");
  // The config marks a module written with a g_idx actorder "group".
  QuarkQuantConfig c;
  c.global = QuarkSpecFor(Spec(false, 8));
  c.exclude = {"lm_head"};
  const OJ j = CtQuantizationConfig({c, {kP, "lm_head"}, {}}, {kP});
  EXPECT_EQ(j["config_groups"]["group_0"]["weights"]["actorder"], "group");
  EXPECT_EQ(j["ignore"], OJ::array({"lm_head"}));
}

// A config.json quantization_config for parsing tests.
OJ Config(OJ groups, OJ ignore = OJ::array({"lm_head"})) {
  return OJ{{"config_groups", std::move(groups)}, {"format", "pack-quantized"}, {"ignore", std::move(ignore)},
            {"kv_cache_scheme", nullptr}, {"quant_method", "compressed-tensors"}, {"quantization_status", "compressed"}};
}
OJ Weights(bool sym, int64_t g) {
  return OJ{{"num_bits", 4}, {"type", "int"}, {"symmetric", sym}, {"group_size", g}, {"strategy", "group"}, {"dynamic", false}};
}
OJ Group(OJ targets, OJ weights) {
  return OJ{{"targets", std::move(targets)}, {"weights", std::move(weights)}, {"input_activations", nullptr}};
}

CtConfig Parse(const OJ& qc) {
  auto c = ParseCtConfig(qc, "cfg");
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? *c : CtConfig{};
}

std::string SpecOf(const CtConfig& c, const std::string& module) {
  auto r = ResolveCt(c, module);
  if (!r.ok()) return "error: " + r.error().message;
  return r->spec ? DescribeSpec(*r->spec) : "float";
}

TEST(CompressedTensorsConfig, TwoGroupsResolvePerModule) {
  const CtConfig c = Parse(Config(OJ{{"group_0", Group(OJ::array({"Linear"}), Weights(false, 128))},
                                     {"group_1", Group(OJ::array({"re:.*self_attn\\.o_proj$", "model.layers.1.mlp.down_proj"}),
                                                       Weights(true, 32))}}));
  EXPECT_EQ(SpecOf(c, "model.layers.0.self_attn.q_proj"), "uint4 per_group g128");
  EXPECT_EQ(SpecOf(c, "model.layers.0.self_attn.o_proj"), "int4 per_group g32");   // regex beats class
  EXPECT_EQ(SpecOf(c, "model.layers.1.mlp.down_proj"), "int4 per_group g32");      // exact beats class
  EXPECT_EQ(SpecOf(c, "model.layers.0.mlp.down_proj"), "uint4 per_group g128");
  EXPECT_EQ(SpecOf(c, "lm_head"), "float");
  EXPECT_EQ(ResolveCt(c, "model.layers.0.self_attn.o_proj")->rule, "config_groups.group_1.targets \"re:.*self_attn\\.o_proj$\"");
  // Channel strategy: one group per row; group_size -1 alone means the same.
  OJ ch = Weights(false, -1);
  ch["strategy"] = "channel";
  ch["group_size"] = nullptr;
  const CtConfig c2 = Parse(Config(OJ{{"group_0", Group(OJ::array({"Linear"}), ch)}}));
  EXPECT_EQ(SpecOf(c2, "model.layers.0.mlp.up_proj"), "uint4 per_channel");
  OJ minus1 = Weights(true, -1);
  minus1.erase("strategy");
  EXPECT_EQ(SpecOf(Parse(Config(OJ{{"group_0", Group(OJ::array({"Linear"}), minus1)}})), "x.q_proj"), "int4 per_channel");
}

TEST(CompressedTensorsConfig, RegexIsAnchoredAtTheStartOnly) {
  const CtConfig c = Parse(Config(OJ{{"group_0", Group(OJ::array({"re:self_attn\\.q_proj", "re:model\\.layers\\.1\\."}),
                                                       Weights(true, 128))}}));
  // re.match: a pattern matching mid-name does not match ...
  EXPECT_EQ(SpecOf(c, "model.layers.0.self_attn.q_proj"), "float");
  // ... and one matching a prefix does, whatever follows.
  EXPECT_EQ(SpecOf(c, "model.layers.1.mlp.up_proj"), "int4 per_group g128");
  EXPECT_EQ(SpecOf(c, "model.layers.10.mlp.up_proj"), "float");
  auto m = CtEntryMatches("model.layers.0.self_attn.q_proj", "re:.*q_proj");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(*m);
  auto prefix = CtEntryMatches("model.layers.10.mlp.up_proj", "re:model\\.layers\\.1");  // not anchored at the end
  ASSERT_TRUE(prefix.ok());
  EXPECT_TRUE(*prefix);
}

TEST(CompressedTensorsConfig, IgnoreByNameRegexAndClass) {
  const OJ g = OJ{{"group_0", Group(OJ::array({"Linear"}), Weights(false, 128))}};
  const CtConfig by_name = Parse(Config(g, OJ::array({"model.layers.0.mlp.down_proj"})));
  EXPECT_EQ(SpecOf(by_name, "model.layers.0.mlp.down_proj"), "float");
  EXPECT_EQ(SpecOf(by_name, "model.layers.0.mlp.down_proj_x"), "uint4 per_group g128");
  EXPECT_EQ(ResolveCt(by_name, "model.layers.0.mlp.down_proj")->rule, "ignore \"model.layers.0.mlp.down_proj\"");
  const CtConfig by_regex = Parse(Config(g, OJ::array({"re:.*mlp\\."})));
  EXPECT_EQ(SpecOf(by_regex, "model.layers.3.mlp.gate_proj"), "float");
  EXPECT_EQ(SpecOf(by_regex, "model.layers.3.self_attn.k_proj"), "uint4 per_group g128");
  const CtConfig by_class = Parse(Config(g, OJ::array({"Linear"})));
  EXPECT_EQ(SpecOf(by_class, "model.layers.3.self_attn.k_proj"), "float");
  // Unused entries are warnings.
  auto unused = CtUnusedEntries(by_name, {"model.layers.0.self_attn.q_proj"});
  ASSERT_TRUE(unused.ok());
  ASSERT_EQ(unused->size(), 1u);
  EXPECT_HAS((*unused)[0], "ignore entry \"model.layers.0.mlp.down_proj\" matched no layer");
}

Error ParseError(const OJ& qc) {
  auto c = ParseCtConfig(qc, "DIR/config.json: quantization_config");
  EXPECT_FALSE(c.ok());
  return c.ok() ? Error{} : c.error();
}

TEST(CompressedTensorsConfig, UnsupportedVariantsAreRefusedNamingThem) {
  const OJ g = OJ{{"group_0", Group(OJ::array({"Linear"}), Weights(false, 128))}};
  for (const char* f : {"marlin-24", "float-quantized", "naive-quantized", "int-quantized", "nvfp4-pack-quantized"}) {
    OJ qc = Config(g);
    qc["format"] = f;
    const Error e = ParseError(qc);
    EXPECT_EQ(e.code, ErrorCode::kUnsupported);
    EXPECT_HAS(e.message, std::string("format \"") + f + "\" is not supported");
  }
  struct Case {
    std::function<void(OJ&)> edit;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[](OJ& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; }, "group_0.weights.num_bits: 8 is not supported"},
      {[](OJ& q) { q["config_groups"]["group_0"]["weights"]["type"] = "float"; }, "weights.type: \"float\" is not supported"},
      {[](OJ& q) { q["config_groups"]["group_0"]["weights"]["dynamic"] = true; }, "dynamic weights"},
      {[](OJ& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"; }, "strategy \"tensor\" is not supported"},
      {[](OJ& q) { q["config_groups"]["group_0"]["weights"]["block_structure"] = "128x128"; }, "block quantization"},
      {[](OJ& q) { q["config_groups"]["group_0"]["input_activations"] = Weights(true, 128); }, "input activation quantization"},
      {[](OJ& q) { q["config_groups"]["group_0"]["output_activations"] = Weights(true, 128); }, "output activation quantization"},
      {[](OJ& q) { q["config_groups"]["group_0"]["format"] = "marlin-24"; }, "group_0.format: format \"marlin-24\""},
      {[](OJ& q) { q["kv_cache_scheme"] = Weights(true, 128); }, "kv_cache_scheme: KV-cache quantization"},
      {[](OJ& q) { q["sparsity_config"] = OJ{{"format", "sparse-24-bitmask"}}; }, "sparsity_config: a sparse weight layout"},
      {[](OJ& q) { q["transform_config"] = OJ{{"config_groups", OJ::object()}, {"x", 1}}; }, "transform_config"},
      {[](OJ& q) { q["quantization_status"] = "frozen"; }, "quantization_status: \"frozen\""},
      {[](OJ& q) { q["ignore"] = OJ::array({"lm_head", "re:(?=x)"}); }, "ignore[1]"},
      {[](OJ& q) { q["config_groups"]["group_0"]["targets"] = OJ::array({"re:("}); }, "group_0.targets[0]"},
  };
  for (const Case& c : cases) {
    OJ qc = Config(g);
    c.edit(qc);
    const Error e = ParseError(qc);
    EXPECT_HAS(e.message, c.what);
    EXPECT_HAS(e.message, "DIR/config.json: quantization_config");
  }
  // What real files carry and changes nothing is accepted.
  OJ ok = Config(g);
  ok["sparsity_config"] = OJ::object();
  ok["transform_config"] = OJ::object();
  ok["version"] = "0.18.1";
  EXPECT_TRUE(ParseCtConfig(ok, "cfg").ok());
}

// A checkpoint directory for loader-level bad inputs: a config over one 16 × 16 down_proj-sized
// set of tensors is enough for ImportCtLinear; the format entry reads the config.
struct BadInput {
  std::function<void(std::vector<TensorToWrite>&)> edit;
  std::vector<std::string> parts;
};

TEST(CompressedTensorsFormat, BadTensorsAreErrorsNamingFileTensorExpectedFound) {
  auto tensors = [] { return Tv1Tensors(); };
  auto find = [](std::vector<TensorToWrite>& ts, const std::string& suffix) -> TensorToWrite& {
    for (auto& t : ts)
      if (t.name == kP + suffix) return t;
    ADD_FAILURE() << suffix;
    return ts[0];
  };
  const std::vector<BadInput> cases = {
      // Quark hf_format tensors under a compressed-tensors config.
      {[&](std::vector<TensorToWrite>& ts) {
         TensorToWrite w = find(ts, ".weight_packed");
         w.name = kP + ".weight";
         w.shape = {16, 1};
         w.bytes.assign(64, 0);
         ts.clear();
         ts.push_back(std::move(w));
       },
       {"tensor " + kP + ".weight_packed: missing; expected I32 [2, 2]", "found " + kP + ".weight (I32 [16, 1])",
        "not compressed-tensors pack-quantized"}},
      {[&](std::vector<TensorToWrite>& ts) {
         const int32_t nk[2] = {2, 32};
         std::memcpy(find(ts, ".weight_shape").bytes.data(), nk, 8);
       },
       {"tensor " + kP + ".weight_shape", "holds [2, 32], expected [2, 16]", "config.json"}},
      {[&](std::vector<TensorToWrite>& ts) {
         TensorToWrite g{kP + ".weight_g_idx", DType::kI32, {15}, std::vector<uint8_t>(60)};
         ts.push_back(std::move(g));
       },
       {"tensor " + kP + ".weight_g_idx", "shape [15], expected [16]"}},
      {[&](std::vector<TensorToWrite>& ts) {
         std::vector<int32_t> g(16, 0);
         g[3] = 2;
         TensorToWrite t{kP + ".weight_g_idx", DType::kI32, {16}, std::vector<uint8_t>(64)};
         std::memcpy(t.bytes.data(), g.data(), 64);
         ts.push_back(std::move(t));
       },
       {"tensor " + kP + ".weight_g_idx", "g_idx[3] = 2, expected a group in 0..1"}},
      {[&](std::vector<TensorToWrite>& ts) { StoreFloatAs(-0.25f, DType::kBF16, find(ts, ".weight_scale").bytes.data() + 2); },
       {"tensor " + kP + ".weight_scale", "scale [0][1] is -0.25 (expected a finite scale >= 0)"}},
      {[&](std::vector<TensorToWrite>& ts) { StoreFloatAs(NAN, DType::kBF16, find(ts, ".weight_scale").bytes.data() + 6); },
       {"tensor " + kP + ".weight_scale", "scale [1][1] is nan"}},
      {[&](std::vector<TensorToWrite>& ts) { find(ts, ".weight_zero_point").shape = {2, 1}; },
       {"tensor " + kP + ".weight_zero_point", "shape [2, 1], expected [1, 2]"}},
      {[&](std::vector<TensorToWrite>& ts) {
         auto& s = find(ts, ".weight_scale");
         s.dtype = DType::kI16;
       },
       {"tensor " + kP + ".weight_scale", "dtype I16, expected F32, F16 or BF16"}},
  };
  for (const BadInput& c : cases) {
    std::vector<TensorToWrite> ts = tensors();
    c.edit(ts);
    TempDir dir;
    auto m = ImportCtLinear(StoreOf(dir, ts), kP, Spec(false, 8), 2, 16);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().code, ErrorCode::kCorruptInput) << m.error().message;
    for (const std::string& p : c.parts) EXPECT_HAS(m.error().message, p);
    EXPECT_HAS(m.error().message, dir.path());  // the file (or the file set)
  }
}

TEST(CompressedTensorsFormat, WriterRefusesScalesItsDtypeCannotHold) {
  Int4Matrix m = Tv1();
  m.scales[3] = 0.1f;  // not a bf16 value
  auto ts = ExportCtLinear(kP, m, Spec(false, 8), DType::kBF16);
  ASSERT_FALSE(ts.ok());
  EXPECT_HAS(ts.error().message, kP + ": scale [1][1] = 0.100000001 is not exactly representable in BF16");
}

// ---- engines ----

std::vector<LinearShapeInfo> Linears(int layers) {
  std::vector<LinearShapeInfo> out;
  for (int l = 0; l < layers; ++l)
    for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                          "mlp.up_proj", "mlp.down_proj"})
      out.push_back({"model.layers." + std::to_string(l) + "." + p, 256, 256});
  out.push_back({"lm_head", 512, 256});
  return out;
}

// An independent model of vLLM's compressed-tensors resolution, for configs whose entries are
// exact names and the class "Linear" only: q/k/v and gate/up run fused; ignore is by name; a
// fused layer takes "Linear" before its shards' names; a quantized lm_head or an unmatched layer
// fails; fused shards must mean the same spec. Returns the group name, "float" or "fails".
std::string VllmModel(const OJ& qc, const std::string& module) {
  auto ignored = [&](const std::string& n) {
    for (const auto& e : qc["ignore"])
      if (e == n) return true;
    return false;
  };
  auto group_by_name = [&](const std::string& n) -> std::string {
    for (const auto& [g, v] : qc["config_groups"].items())
      for (const auto& t : v["targets"])
        if (t == n) return g;
    return "";
  };
  std::string linear_group;
  for (const auto& [g, v] : qc["config_groups"].items())
    for (const auto& t : v["targets"])
      if (t == "Linear" && linear_group.empty()) linear_group = g;
  if (module == "lm_head") return ignored(module) ? "float" : "fails";
  const std::string leaf = module.substr(module.rfind('.') + 1), prefix = module.substr(0, module.rfind('.') + 1);
  std::vector<std::string> shards;
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") shards = {"q_proj", "k_proj", "v_proj"};
  if (leaf == "gate_proj" || leaf == "up_proj") shards = {"gate_proj", "up_proj"};
  if (shards.empty()) {
    if (ignored(module)) return "float";
    const std::string g = group_by_name(module);
    return !g.empty() ? g : !linear_group.empty() ? linear_group : "fails";
  }
  int n_ignored = 0;
  for (const auto& s : shards) n_ignored += ignored(prefix + s) ? 1 : 0;
  if (n_ignored == static_cast<int>(shards.size())) return "float";
  if (n_ignored != 0) return "fails";
  if (!linear_group.empty()) {  // the class pass comes before the shards' names
    for (const auto& s : shards)
      if (!group_by_name(prefix + s).empty() && group_by_name(prefix + s) != linear_group) return "fails";
    return linear_group;
  }
  std::string first;
  for (const auto& s : shards) {
    const std::string g = group_by_name(prefix + s);
    if (g.empty()) return "fails";
    if (first.empty()) first = g;
    if (g != first) return "fails";  // one scheme for shards of different specs
  }
  return first;
}

void ExpectVllmColumnMatchesModel(const OJ& qc) {
  const CtConfig c = Parse(qc);
  auto rep = ReportCtEngines(c, Linears(2), false);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  ASSERT_EQ(rep->engines[2], "vllm");
  for (const auto& l : rep->linears) {
    const std::string want = VllmModel(qc, l.shape.name);
    const EngineReading& got = l.readings[2];
    std::string want_text = want;
    for (const CtGroup& g : c.groups)
      if (g.name == want) want_text = DescribeSpec(CtSpecFor(*g.weights));
    EXPECT_EQ(got.text, want == "fails" ? "fails to load" : want_text) << l.shape.name << " " << qc.dump();
    // ONNX Runtime GenAI's builder does not read the format.
    EXPECT_EQ(l.readings[3].text, "fails to load");
    EXPECT_FALSE(l.readings[3].agrees);
  }
}

TEST(CompressedTensorsEngines, ExportWithIgnoreListAgreesWithVllmModel) {
  std::vector<std::string> modules;
  for (const auto& l : Linears(2)) modules.push_back(l.name);
  QuarkQuantConfig req;
  req.global = QuarkSpecFor(Spec(false, 128));
  req.exclude = {"lm_head", "model.layers.1.mlp.down_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"};
  req.layer_quant_config = {{"model.layers.0.self_attn.o_proj", QuarkSpecFor(Spec(true, 32))}};
  const OJ written = CtQuantizationConfig({req, modules, {}}, {});
  EXPECT_EQ(written["config_groups"]["group_0"]["targets"], OJ::array({"Linear"}));
  EXPECT_EQ(written["config_groups"]["group_1"]["targets"], OJ::array({"model.layers.0.self_attn.o_proj"}));
  EXPECT_EQ(written["ignore"], OJ::array({"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                                          "model.layers.1.mlp.down_proj", "lm_head"}));
  ExpectVllmColumnMatchesModel(written);
  // Every module of the export resolves the same for nibble, Transformers and vLLM.
  auto rep = ReportCtEngines(Parse(written), Linears(2), false);
  ASSERT_TRUE(rep.ok());
  for (const auto& l : rep->linears)
    for (size_t e = 0; e < 3; ++e) EXPECT_TRUE(l.readings[e].agrees) << l.shape.name << " " << rep->engines[e];
  // A fused shard with its own spec: the writer names every module instead of "Linear".
  req.layer_quant_config.push_back({"model.layers.1.self_attn.q_proj", QuarkSpecFor(Spec(false, 64))});
  req.layer_quant_config.push_back({"model.layers.1.self_attn.k_proj", QuarkSpecFor(Spec(false, 64))});
  req.layer_quant_config.push_back({"model.layers.1.self_attn.v_proj", QuarkSpecFor(Spec(false, 64))});
  const OJ named = CtQuantizationConfig({req, modules, {}}, {});
  EXPECT_EQ(named["config_groups"]["group_0"]["targets"].size(), 7u);  // the g128 modules by name
  ExpectVllmColumnMatchesModel(named);
  auto rep2 = ReportCtEngines(Parse(named), Linears(2), false);
  ASSERT_TRUE(rep2.ok());
  for (const auto& l : rep2->linears) EXPECT_TRUE(l.readings[2].agrees) << l.shape.name;
}

TEST(CompressedTensorsEngines, HandWrittenConfigsVllmMisreads) {
  // "Linear" plus exact names for fused shards: vLLM's class pass wins for the fused layer.
  const OJ class_first = Config(OJ{{"group_0", Group(OJ::array({"Linear"}), Weights(false, 128))},
                                   {"group_1", Group(OJ::array({"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                                                                "model.layers.0.self_attn.v_proj"}),
                                                     Weights(false, 32))}});
  ExpectVllmColumnMatchesModel(class_first);
  // Shards of different specs, a shard ignored alone, an untargeted layer, a quantized lm_head.
  OJ mixed = Config(OJ{{"group_0", Group(OJ::array({"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
                                                    "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "lm_head"}),
                                         Weights(true, 128))},
                       {"group_1", Group(OJ::array({"model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"}),
                                         Weights(true, 64))}},
                    OJ::array({"model.layers.0.mlp.up_proj"}));
  ExpectVllmColumnMatchesModel(mixed);
  auto rep = ReportCtEngines(Parse(class_first), Linears(1), false);
  ASSERT_TRUE(rep.ok());
  const auto lines = EngineDisagreementLines(*rep);
  bool vllm = false;
  for (const auto& l : lines) vllm = vllm || Has(l, "vllm misreads 3 linears");
  EXPECT_TRUE(vllm);
  // ONNX Runtime GenAI reads no compressed-tensors checkpoint: one line about the format (with
  // what to run instead), not a misreading of each linear or of the float lm_head.
  for (const auto& l : lines) EXPECT_FALSE(Has(l, "onnxruntime-genai")) << l;
  const auto unread = EngineNotReadingLines(*rep);
  ASSERT_EQ(unread.size(), 1u);
  EXPECT_TRUE(Has(unread[0], "onnxruntime-genai does not read this checkpoint")) << unread[0];
  EXPECT_TRUE(Has(unread[0], "nibble export-onnx")) << unread[0];
}

// ---- quantize → load ----

std::map<std::string, Int4Matrix> LoadMatrices(const std::string& dir) {
  std::map<std::string, Int4Matrix> out;
  auto fmt = OpenCheckpointFormat(dir);
  auto mc = LoadModelConfig(dir);
  auto store = TensorStore::OpenDir(dir);
  EXPECT_TRUE(fmt.ok() && *fmt && mc.ok() && store.ok());
  if (!fmt.ok() || !*fmt || !mc.ok() || !store.ok()) return out;
  for (const std::string& name : LinearModuleNames(*mc, true)) {
    auto plan = (*fmt)->Resolve(name);
    const auto [n, k] = LinearShape(*mc, name);
    auto m = (*fmt)->Import(*store, name, *plan, n, k);
    EXPECT_TRUE(m.ok()) << m.error().message;
    if (m.ok() && *m) out[name] = **m;
  }
  return out;
}

TEST(CompressedTensorsFormat, QuantizeExportLoadsAsTheHfFormatExport) {
  for (const char* scheme : {"w_uint4_per_group_asym", "w_int4_per_group_sym"}) {
    TempDir tmp;
    QuantizeRequest r;
    r.model_dir = nibble_test::EmbeddedModel();
    r.quant_scheme = scheme;
    r.group_size = 128;
    r.overwrite = true;
    r.output_dir = tmp.sub("quark");
    ASSERT_TRUE(Quantize(r).ok());
    r.output_dir = tmp.sub("ct");
    r.model_export = "compressed-tensors";
    auto s = Quantize(r);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto quark = LoadMatrices(tmp.sub("quark")), ct = LoadMatrices(tmp.sub("ct"));
    EXPECT_EQ(quark.size(), 42u);  // every linear but the excluded lm_head
    ASSERT_EQ(quark.size(), ct.size());
    for (const auto& [name, m] : quark) {
      ASSERT_TRUE(ct.count(name)) << name;
      EXPECT_TRUE(ct.at(name) == m) << scheme << " " << name;
    }
    auto fmt = OpenCheckpointFormat(tmp.sub("ct"));
    ASSERT_TRUE(fmt.ok());
    EXPECT_EQ((*fmt)->name(), "compressed-tensors");
    auto lm = (*fmt)->Resolve("lm_head");
    ASSERT_TRUE(lm.ok());
    EXPECT_FALSE(lm->spec);
    auto inspect = Inspect(tmp.sub("ct"));
    ASSERT_TRUE(inspect.ok()) << inspect.error().message;
    EXPECT_EQ(inspect->format, "compressed-tensors");
  }
}

}  // namespace
}  // namespace nibble
