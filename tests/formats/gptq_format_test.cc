// GPTQ and AutoAWQ GEMM: SPEC §7 words, v1 / v2 zero conventions, g_idx, config checks, and
// exports of the embedded model that load as the same Int4Matrix as its hf_format export.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nibble/quantize.h>
#include <nlohmann/json.hpp>

#include "formats/autoawq_format.h"
#include "formats/checkpoint_format.h"
#include "formats/float_dtype.h"
#include "formats/gptq_format.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "test_paths.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
const std::string kMod = "model.layers.0.mlp.up_proj";

// TV-1 (SPEC §7) widened to N = 8: outputs 2..7 get codes 0 and zero point `pad_zero`.
Int4Matrix Tv1(uint8_t pad_zero) {
  const uint8_t rows[2][16] = {{0, 1, 2, 4, 6, 8, 12, 15, 2, 4, 6, 8, 10, 12, 14, 15},
                               {0, 2, 4, 6, 8, 10, 12, 15, 0, 3, 7, 11, 15, 14, 13, 9}};
  Int4Matrix m;
  m.n = 8;
  m.k = 16;
  m.group_size = 8;
  m.codes.assign(8 * 16, 0);
  m.scales.assign(16, 0.25f);
  m.zero_points.assign(16, pad_zero);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 16; ++c) m.codes[static_cast<size_t>(r * 16 + c)] = rows[r][c];
  const uint8_t z[2][2] = {{4, 0}, {8, 15}};
  for (int r = 0; r < 2; ++r)
    for (int g = 0; g < 2; ++g) m.zero_points[static_cast<size_t>(r * 2 + g)] = z[r][g];
  return m;
}

uint32_t Word(const TensorToWrite& t, size_t i) {
  uint32_t w;
  std::memcpy(&w, t.bytes.data() + 4 * i, 4);
  return w;
}

ExportRequest Request(bool sym, const std::string& gptq_format) {
  ExportRequest r;
  WeightQuantSpec s;
  s.dtype = sym ? QuantDType::kInt4 : QuantDType::kUint4;
  s.symmetric = sym;
  s.group_size = 8;
  r.config.global = s;
  r.gptq_format = gptq_format;
  return r;
}

QuantSpec Spec(bool sym) {
  QuantSpec q;
  q.group_size = 8;
  q.symmetric = sym;
  return q;
}

// A checkpoint dir holding `tensors` and config.json's quantization_config `qc`.
std::string WriteDir(const std::string& tag, const nlohmann::json& qc, const std::vector<TensorToWrite>& tensors) {
  const std::string dir = (fs::temp_directory_path() / ("nibble_gptq_" + tag + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << nlohmann::json{{"quantization_config", qc}}.dump();
  std::vector<const TensorToWrite*> ptrs;
  for (const auto& t : tensors) ptrs.push_back(&t);
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", ptrs, {{"format", "pt"}}).ok());
  return dir;
}

Result<std::optional<Int4Matrix>> ImportFrom(const std::string& dir, const std::string& module, int64_t n, int64_t k) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> f, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, f->Resolve(module));
  return f->Import(store, module, plan, n, k);
}

nlohmann::json GptqConfig(bool sym, bool v2) {
  return {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 8}, {"sym", sym}, {"desc_act", false},
          {"checkpoint_format", v2 ? "gptq_v2" : "gptq"}};
}

TEST(GptqFormat, Tv1WordsBitForBitAndV1Borrow) {
  auto w = GptqFormatEntry().writer(Request(false, "v2"));
  ASSERT_TRUE(w.ok());
  auto t = (*w)->WriteLinear(kMod, Tv1(0), Spec(false), DType::kF16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const TensorToWrite& qweight = (*t)[0];
  ASSERT_EQ(qweight.shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(Word(qweight, 0), 0xFC864210u);  // [row 0][out 0]
  EXPECT_EQ(Word(qweight, 1), 0xFCA86420u);  // [row 0][out 1]
  EXPECT_EQ(Word(qweight, 8), 0xFECA8642u);
  EXPECT_EQ(Word(qweight, 9), 0x9DEFB730u);
  const TensorToWrite& qzeros = (*t)[1];
  EXPECT_EQ(Word(qzeros, 0), 0x84u);  // v2 stores z
  EXPECT_EQ(Word(qzeros, 1), 0xF0u);
  // GPTQModel's v1 conversion subtracts 0x11111111: the padding zeros of 0 borrow (SPEC §7).
  EXPECT_EQ(Word(qzeros, 0) - 0x11111111u, 0xEEEEEF73u);
  EXPECT_EQ(Word(qzeros, 1) - 0x11111111u, 0xEEEEEFDFu);
  // Such a v1 word is refused on read, naming the tensor, group and output.
  std::vector<TensorToWrite> v1 = std::move(*t);
  const uint32_t bad[2] = {0xEEEEEF73u, 0xEEEEEFDFu};
  std::memcpy(v1[1].bytes.data(), bad, 8);
  const std::string dir = WriteDir("borrow", GptqConfig(false, false), v1);
  auto r = ImportFrom(dir, kMod, 8, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(kMod + ".qzeros"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("group 0, output 2"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("not a valid v1 file"), std::string::npos) << r.error().message;
}

TEST(GptqFormat, V1RoundTripAndTheWriterRefusesZeroPointZero) {
  auto w = GptqFormatEntry().writer(Request(false, "v1"));
  ASSERT_TRUE(w.ok());
  auto refused = (*w)->WriteLinear(kMod, Tv1(8), Spec(false), DType::kF16);  // row 0 group 1 has z = 0
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("row 0, group 1"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("--gptq_format v2"), std::string::npos);
  Int4Matrix m = Tv1(8);
  m.zero_points[1] = 1;  // representable in v1
  auto t = (*w)->WriteLinear(kMod, m, Spec(false), DType::kF16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const std::string dir = WriteDir("v1", GptqConfig(false, false), *t);
  auto back = ImportFrom(dir, kMod, 8, 16);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(**back, m);
}

TEST(GptqFormat, SymmetricV1StoresSevensAndReadsZeroEight) {
  Int4Matrix m = Tv1(8);
  m.symmetric = true;
  m.zero_points.assign(16, 8);
  auto w = GptqFormatEntry().writer(Request(true, "v1"));
  ASSERT_TRUE(w.ok());
  auto t = (*w)->WriteLinear(kMod, m, Spec(true), DType::kF16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(Word((*t)[1], 0), 0x77777777u);
  const std::string dir = WriteDir("sym", GptqConfig(true, false), *t);
  auto back = ImportFrom(dir, kMod, 8, 16);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(**back, m);
  // The same words read as v2 are zeros of 7, which sym true refuses.
  const std::string dir2 = WriteDir("sym2", GptqConfig(true, true), *t);
  auto bad = ImportFrom(dir2, kMod, 8, 16);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("expected stored 8"), std::string::npos) << bad.error().message;
}

// K = 256, g = 128, columns alternating between the two groups.
TEST(GptqFormat, ActOrderGIdxDequantizesThroughTheGroups) {
  Int4Matrix m;
  m.n = 8;
  m.k = 256;
  m.group_size = 128;
  m.codes.resize(8 * 256);
  for (size_t i = 0; i < m.codes.size(); ++i) m.codes[i] = static_cast<uint8_t>((i * 7) % 16);
  m.scales = {0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f};
  m.zero_points.assign(16, 3);
  for (int c = 0; c < 256; ++c) m.g_idx.push_back(c % 2);
  auto r = Request(false, "v2");
  r.config.global->group_size = 128;
  auto w = GptqFormatEntry().writer(r);
  ASSERT_TRUE(w.ok());
  QuantSpec spec = Spec(false);
  spec.group_size = 128;
  auto t = (*w)->WriteLinear(kMod, m, spec, DType::kF16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE((*w)->QuantizationConfig(r)["desc_act"].get<bool>());
  nlohmann::json qc = GptqConfig(false, true);
  qc["group_size"] = 128;
  qc["desc_act"] = true;
  auto back = ImportFrom(WriteDir("gidx", qc, *t), kMod, 8, 256);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ((*back)->g_idx, m.g_idx);
  std::vector<float> got(8 * 256), want(8 * 256);
  DequantizeRef(**back, got.data());
  for (int n = 0; n < 8; ++n)
    for (int c = 0; c < 256; ++c)
      want[static_cast<size_t>(n * 256 + c)] = (m.codes[static_cast<size_t>(n * 256 + c)] - 3.0f) * (c % 2 ? 0.25f : 0.5f);
  EXPECT_EQ(got, want);
  // desc_act false with the same non-natural g_idx is an error; so is an index >= G.
  qc["desc_act"] = false;
  auto off = ImportFrom(WriteDir("gidx2", qc, *t), kMod, 8, 256);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.error().message.find("desc_act is false"), std::string::npos) << off.error().message;
  std::vector<TensorToWrite> bad = std::move(*t);
  const int32_t two = 2;
  std::memcpy(bad[3].bytes.data() + 4 * 5, &two, 4);
  qc["desc_act"] = true;
  auto big = ImportFrom(WriteDir("gidx3", qc, bad), kMod, 8, 256);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("g_idx[5] = 2, expected a group 0..1"), std::string::npos) << big.error().message;
}

TEST(GptqFormat, ConfigChecks) {
  // ordered_json: the file's key order decides which dynamic entry comes first.
  auto open = [](const nlohmann::ordered_json& qc) {
    return GptqFormatEntry().open(nlohmann::ordered_json{{"quantization_config", qc}}.dump(), "/nonexistent/config.json");
  };
  nlohmann::ordered_json qc = nlohmann::ordered_json::parse(GptqConfig(false, false).dump());
  qc["checkpoint_format"] = "marlin";
  auto marlin = open(qc);
  ASSERT_FALSE(marlin.ok());
  EXPECT_EQ(marlin.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(marlin.error().message.find("\"marlin\""), std::string::npos);
  qc["checkpoint_format"] = "gptq";
  qc["bits"] = 8;
  EXPECT_FALSE(open(qc).ok());
  // dynamic: first match wins, -: excludes, re.match anchors only the start.
  qc["bits"] = 4;
  qc["dynamic"] = nlohmann::ordered_json::parse(
      R"({"-:model\\.layers\\.1\\.": {}, "+:model\\.layers\\.1": {"group_size": 4, "sym": true}, ".*down_proj": {"group_size": 16}})");
  auto f = open(qc);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto p1 = (*f)->Resolve("model.layers.1.mlp.up_proj");
  ASSERT_TRUE(p1.ok());
  EXPECT_FALSE(p1->spec.has_value());
  auto p10 = (*f)->Resolve("model.layers.10.mlp.up_proj");
  ASSERT_TRUE(p10.ok() && p10->spec);
  EXPECT_EQ(p10->spec->group_size, 4);
  EXPECT_TRUE(p10->spec->symmetric);
  auto p2 = (*f)->Resolve("model.layers.2.mlp.down_proj");
  ASSERT_TRUE(p2.ok() && p2->spec);
  EXPECT_EQ(p2->spec->group_size, 16);
  auto lm = (*f)->Resolve("lm_head");
  ASSERT_TRUE(lm.ok());
  EXPECT_FALSE(lm->spec.has_value());
}

TEST(GptqFormat, QuantizeConfigJsonMustAgreeAndQuarkTensorsAreNamed) {
  auto w = GptqFormatEntry().writer(Request(false, "v2"));
  ASSERT_TRUE(w.ok());
  auto t = (*w)->WriteLinear(kMod, Tv1(0), Spec(false), DType::kF16);
  ASSERT_TRUE(t.ok());
  const std::string dir = WriteDir("agree", GptqConfig(false, true), *t);
  nlohmann::json side = GptqConfig(false, true);
  side["group_size"] = 64;
  std::ofstream(dir + "/quantize_config.json") << side.dump();
  auto f = OpenCheckpointFormat(dir);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("group_size"), std::string::npos) << f.error().message;
  EXPECT_NE(f.error().message.find("quantize_config.json"), std::string::npos);
  // Quark's tensor names under a GPTQ config: the missing qweight names what is stored.
  std::vector<TensorToWrite> quark(1);
  quark[0] = {kMod + ".weight", DType::kI32, {16, 1}, std::vector<uint8_t>(64, 0), nullptr, 0};
  auto r = ImportFrom(WriteDir("quark", GptqConfig(false, true), quark), kMod, 8, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(kMod + ".qweight: missing"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(kMod + ".weight I32"), std::string::npos) << r.error().message;
}

TEST(GptqFormat, NegativeOrNonFiniteScalesAreErrors) {
  auto w = GptqFormatEntry().writer(Request(false, "v2"));
  ASSERT_TRUE(w.ok());
  auto t = (*w)->WriteLinear(kMod, Tv1(0), Spec(false), DType::kF16);
  ASSERT_TRUE(t.ok());
  StoreFloatAs(-0.25f, DType::kF16, (*t)[2].bytes.data() + 2 * 3);
  auto r = ImportFrom(WriteDir("neg", GptqConfig(false, true), *t), kMod, 8, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("scale for group 0, output 3 is -0.25"), std::string::npos) << r.error().message;
}

TEST(AutoAwqFormat, Tv1WordsAndVariants) {
  ExportRequest r = Request(false, "v1");
  auto w = AutoAwqFormatEntry().writer(r);
  ASSERT_TRUE(w.ok());
  auto t = (*w)->WriteLinear(kMod, Tv1(0), Spec(false), DType::kF16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  // qweight [K, N/8] in AWQ order = Quark reorder's TV-1 words.
  EXPECT_EQ(Word((*t)[0], 1), 0x00020001u);
  EXPECT_EQ(Word((*t)[0], 15), 0x0009000Fu);
  EXPECT_EQ(Word((*t)[1], 0), 0x00080004u);
  EXPECT_EQ(Word((*t)[1], 1), 0x000F0000u);
  // TV-2: codes 1..8 of one input row.
  Int4Matrix m = Tv1(0);
  for (int n = 0; n < 8; ++n) m.codes[static_cast<size_t>(n * 16)] = static_cast<uint8_t>(n + 1);
  auto t2 = (*w)->WriteLinear(kMod, m, Spec(false), DType::kF16);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(Word((*t2)[0], 0), 0x86427531u);
  const nlohmann::json qc = {{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 8}, {"zero_point", true}, {"version", "GEMM"}};
  auto back = ImportFrom(WriteDir("awq", qc, *t2), kMod, 8, 16);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(**back, m);
  for (const char* v : {"gemv", "gemv_fast", "marlin", "exllama"}) {
    nlohmann::json bad = qc;
    bad["version"] = v;
    auto f = AutoAwqFormatEntry().open(nlohmann::json{{"quantization_config", bad}}.dump(), "x/config.json");
    ASSERT_FALSE(f.ok()) << v;
    EXPECT_EQ(f.error().code, ErrorCode::kUnsupported);
  }
  ExportRequest sym = Request(true, "v1");
  auto refused = AutoAwqFormatEntry().writer(sym);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("--model_export gptq or compressed-tensors"), std::string::npos);
}

// The engines report of an AutoAWQ config with modules_to_not_convert against a model of the
// substring rule written here: nibble and Transformers keep a module float exactly when an entry
// is a substring of its name; vLLM fails on a fused module whose shards disagree.
TEST(AutoAwqFormat, EnginesFollowTheSubstringRule) {
  const std::vector<std::string> entries = {"layers.1.", "self_attn.q_proj", "mlp.down"};
  const nlohmann::json qc = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"zero_point", true},
                             {"version", "gemm"}, {"modules_to_not_convert", entries}};
  auto f = AutoAwqFormatEntry().open(nlohmann::json{{"quantization_config", qc}}.dump(), "x/config.json");
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::vector<LinearShapeInfo> linears;
  for (int l = 0; l < 11; ++l)
    for (const char* leaf : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                             "mlp.up_proj", "mlp.down_proj"})
      linears.push_back({"model.layers." + std::to_string(l) + "." + leaf, 256, 256});
  auto rep = (*f)->Engines(linears, false);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  ASSERT_EQ(rep->engines[2], "vllm");
  for (const auto& l : rep->linears) {
    bool skip = false;
    for (const std::string& e : entries) skip = skip || l.shape.name.find(e) != std::string::npos;
    EXPECT_EQ(l.meant == "float", skip) << l.shape.name;
    EXPECT_EQ(l.readings[1].text == "float", skip) << l.shape.name;
    const bool qkv = l.shape.name.find("_proj") != std::string::npos && l.shape.name.find("self_attn.o_proj") == std::string::npos &&
                     l.shape.name.find("self_attn") != std::string::npos;
    const bool split = qkv && l.shape.name.find("layers.1.") == std::string::npos;  // q float, k/v quantized
    EXPECT_EQ(l.readings[2].text == "fails to load", split) << l.shape.name;
  }
}

// The embedded model exported RTN g128 to awq and gptq loads as the hf_format export with fp16
// scales (scale_type float16 through a Quark config) does, linear by linear.
void ExpectSameAsHfFormat(const std::string& model_export, const std::string& scheme, const std::string& gptq_format) {
  const std::string base = (fs::temp_directory_path() / ("nibble_awqgptq_e2e_" + std::to_string(::getpid()))).string();
  QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.quant_scheme = scheme;
  r.overwrite = true;
  r.output_dir = base + "_" + model_export;
  r.model_export = model_export;
  r.gptq_format = gptq_format;
  auto a = Quantize(r);
  ASSERT_TRUE(a.ok()) << a.error().message;
  nlohmann::json cfg = nlohmann::json::parse(a->quantization_config_json);
  // The same request as Quark hf_format with fp16 scales.
  QuantizeRequest hf = r;
  hf.model_export = "hf_format";
  hf.output_dir = base + "_hf";
  auto first = Quantize(hf);
  ASSERT_TRUE(first.ok()) << first.error().message;
  nlohmann::json q = nlohmann::json::parse(first->quantization_config_json);
  q["global_quant_config"]["weight"]["scale_type"] = "float16";
  for (auto& [k, v] : q["layer_quant_config"].items())
    if (v.is_object() && v.contains("weight") && v["weight"].is_object()) v["weight"]["scale_type"] = "float16";
  std::ofstream(base + "_qc.json") << q.dump();
  hf.quant_config_file = base + "_qc.json";
  auto second = Quantize(hf);
  ASSERT_TRUE(second.ok()) << second.error().message;
  auto fa = OpenCheckpointFormat(r.output_dir);
  auto fb = OpenCheckpointFormat(hf.output_dir);
  auto sa = TensorStore::OpenDir(r.output_dir);
  auto sb = TensorStore::OpenDir(hf.output_dir);
  auto mc = LoadModelConfig(r.model_dir);
  ASSERT_TRUE(fa.ok() && fb.ok() && sa.ok() && sb.ok() && mc.ok());
  int quantized = 0;
  for (const std::string& name : LinearModuleNames(*mc, true)) {
    const auto [n, k] = LinearShape(*mc, name);
    auto pa = (*fa)->Resolve(name);
    auto pb = (*fb)->Resolve(name);
    ASSERT_TRUE(pa.ok() && pb.ok());
    auto ma = (*fa)->Import(*sa, name, *pa, n, k);
    auto mb = (*fb)->Import(*sb, name, *pb, n, k);
    ASSERT_TRUE(ma.ok()) << ma.error().message;
    ASSERT_TRUE(mb.ok()) << mb.error().message;
    ASSERT_EQ(ma->has_value(), mb->has_value()) << name;
    if (!ma->has_value()) continue;
    EXPECT_EQ(**ma, **mb) << name;
    ++quantized;
  }
  EXPECT_EQ(quantized, 6 * 7);  // lm_head excluded
}

TEST(AwqGptqExport, EmbeddedModelMatchesHfFormat) {
  ExpectSameAsHfFormat("awq", "w_uint4_per_group_asym", "v1");
  ExpectSameAsHfFormat("gptq", "w_uint4_per_group_asym", "v1");
  ExpectSameAsHfFormat("gptq", "w_int4_per_group_sym", "v2");
}

}  // namespace
}  // namespace nibble
