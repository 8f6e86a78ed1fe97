// Quark configs as other engines read them: comma-separated keys, entries that decide nothing,
// the canonical config (checked against an exact-name-only matcher written here, separately from
// the production code), the engines report and tensor-parallel readiness.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/quark_canonical.h"
#include "formats/quark_config.h"
#include "formats/quark_engines.h"

namespace {

using nibble::QuarkQuantConfig;
using nibble::WeightQuantSpec;

WeightQuantSpec G(int64_t g, bool sym = false) {
  WeightQuantSpec s;
  s.group_size = g;
  s.symmetric = sym;
  s.dtype = sym ? nibble::QuantDType::kInt4 : nibble::QuantDType::kUint4;
  return s;
}

// Two decoder layers of a Llama and its lm_head.
std::vector<std::string> Modules() {
  std::vector<std::string> m;
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                          "mlp.up_proj", "mlp.down_proj"})
      m.push_back("model.layers." + std::to_string(l) + "." + p);
  m.push_back("lm_head");
  return m;
}

// The independent model of exact-name-only resolution (vLLM's exact / `re:`-free exclude check
// and a per-layer lookup by exact key): what an engine without any pattern matching reads.
std::optional<WeightQuantSpec> ExactOnly(const QuarkQuantConfig& c, const std::string& name) {
  for (const std::string& e : c.exclude)
    if (e == name) return std::nullopt;
  for (const auto& [key, spec] : c.layer_quant_config)
    if (key == name) return spec;
  return c.global;
}

TEST(QuarkCommaKeys, EachPartMatchesTheWholeName) {
  QuarkQuantConfig c;
  c.global = G(128);
  c.layer_quant_config = {{"model.layers.0.mlp.down_proj, model.layers.1.mlp.*", G(32)}};
  auto a = nibble::ResolveLayer(c, "model.layers.0.mlp.down_proj");
  auto b = nibble::ResolveLayer(c, "model.layers.1.mlp.up_proj");
  auto d = nibble::ResolveLayer(c, "model.layers.0.mlp.up_proj");
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  EXPECT_EQ(a->spec->group_size, 32);
  EXPECT_EQ(b->spec->group_size, 32);
  EXPECT_EQ(d->spec->group_size, 128);
  EXPECT_EQ(nibble::LayerKeyPatterns(" a , b,,c "), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(QuarkUnusedEntries, NamesKeysPartsTypesAndExcludedOnes) {
  QuarkQuantConfig c;
  c.global = G(128);
  c.exclude = {"lm_head", "*lm_head", "lm_haed", "re:.*1\\.self_attn\\.o_proj$"};
  c.layer_quant_config = {{"nomatch.*", G(32)},
                          {"model.layers.0.mlp.down_proj,typo.x", G(32)},
                          {"lm_head", G(32)},
                          {"*.mlp.down_proj", G(64)}};
  c.layer_type_quant_config = {{"nn.Linear", G(32)}};
  auto w = nibble::UnusedConfigEntries(c, Modules());
  ASSERT_TRUE(w.ok());
  std::string all;
  for (const auto& s : *w) all += s + "\n";
  EXPECT_NE(all.find("exclude entry \"lm_haed\" matched no layer"), std::string::npos) << all;
  EXPECT_NE(all.find("pattern \"nomatch.*\" matched no layer"), std::string::npos) << all;
  EXPECT_NE(all.find("pattern \"typo.x\" matched no layer"), std::string::npos) << all;
  EXPECT_NE(all.find("\"lm_head\" decides no layer: lm_head is excluded by \"lm_head\""), std::string::npos) << all;
  EXPECT_NE(all.find("type \"nn.Linear\" matches no layer"), std::string::npos) << all;
  EXPECT_NE(all.find("\"Linear\", the only type accepted"), std::string::npos) << all;
  EXPECT_EQ(all.find("\"*.mlp.down_proj\""), std::string::npos) << all;  // decides layer 1's down_proj
  EXPECT_EQ(all.find("o_proj"), std::string::npos) << all;  // the re: entry matches layer 1's
  EXPECT_EQ(w->size(), 5u) << all;
  // Entries aimed at lm_head are not reported where the model lists none (tied).
  std::vector<std::string> no_head = Modules();
  no_head.pop_back();
  QuarkQuantConfig tied;
  tied.global = G(128);
  tied.exclude = {"lm_head", "*lm_head", "re:.*lm_head$"};
  auto t = nibble::UnusedConfigEntries(tied, no_head);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->empty()) << (*t)[0];
}

TEST(QuarkCanonical, ResolvesAlikeUnderQuarkAndExactNameRules) {
  QuarkQuantConfig c;
  c.global = G(128);
  c.exclude = {"lm_head", "*.mlp.down_proj", "re:model\\.layers\\.1\\.self_attn\\.[kv]_proj", ""};
  c.layer_quant_config = {{"model.layers.0.self_attn.*", G(32, true)}, {"model.layers.1.mlp.gate_proj,nomatch", G(64)}};
  c.layer_type_quant_config = {{"Linear", G(256)}};
  auto canon = nibble::CanonicalQuarkConfig(c, Modules(), {});
  ASSERT_TRUE(canon.ok());
  for (const std::string& m : Modules()) {
    auto quark = nibble::ResolveLayer(c, m);
    ASSERT_TRUE(quark.ok());
    EXPECT_EQ(quark->spec, ExactOnly(*canon, m)) << m;
    auto again = nibble::ResolveLayer(*canon, m);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->spec, quark->spec) << m;
  }
  EXPECT_EQ(canon->exclude.front(), "lm_head");  // plain names kept first, in the user's order
  EXPECT_TRUE(canon->layer_type_quant_config.empty());
  auto twice = nibble::CanonicalQuarkConfig(*canon, Modules(), {});
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(*twice, *canon);
}

TEST(QuarkCanonical, TheCommonSpecBecomesGlobalSoOrtGenaiReadsIt) {
  QuarkQuantConfig c;
  c.global = G(128);
  c.exclude = {"lm_head"};
  c.layer_quant_config = {{"model.layers.*", G(64)}};
  auto canon = nibble::CanonicalQuarkConfig(c, Modules(), {});
  ASSERT_TRUE(canon.ok());
  EXPECT_EQ(canon->global, G(64));
  EXPECT_TRUE(canon->layer_quant_config.empty());
  c.exclude.clear();  // lm_head keeps g128: one exact key, which ORT GenAI's top-level lookup finds
  canon = nibble::CanonicalQuarkConfig(c, Modules(), {});
  ASSERT_TRUE(canon.ok());
  ASSERT_EQ(canon->layer_quant_config.size(), 1u);
  EXPECT_EQ(canon->layer_quant_config[0].first, "lm_head");
  std::vector<nibble::LinearShapeInfo> shapes;
  for (const std::string& m : Modules()) shapes.push_back({m, 256, 256});
  auto r = nibble::ReportEngines(*canon, shapes, false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(nibble::EngineDisagreementLines(*r).empty());
}

TEST(QuarkCanonical, AnAbsentTiedLmHeadIsNeverDeclaredQuantized) {
  QuarkQuantConfig c;
  c.global = G(128);
  std::vector<std::string> mods = Modules();
  mods.pop_back();
  auto canon = nibble::CanonicalQuarkConfig(c, mods, {"lm_head"});
  ASSERT_TRUE(canon.ok());
  EXPECT_EQ(canon->exclude, std::vector<std::string>{"lm_head"});
}

std::vector<nibble::LinearShapeInfo> Shapes(int64_t h, int64_t inter) {
  std::vector<nibble::LinearShapeInfo> s;
  for (const std::string& m : Modules()) {
    const bool down = m.ends_with("down_proj"), up = m.ends_with("gate_proj") || m.ends_with("up_proj");
    s.push_back({m, m == "lm_head" ? 4096 : down ? h : up ? inter : h, down ? inter : h});
  }
  return s;
}

const nibble::EngineReading& Reading(const nibble::EnginesReport& r, const std::string& module, const std::string& engine) {
  size_t e = 0;
  while (r.engines[e] != engine) ++e;
  for (const auto& l : r.linears)
    if (l.shape.name == module) return l.readings[e];
  std::abort();
}

TEST(QuarkEngines, GlobExcludesFusedShardsAndOrtLookups) {
  QuarkQuantConfig c;
  c.global = G(128);
  c.exclude = {"lm_head", "*.mlp.down_proj"};
  c.layer_quant_config = {{"model.layers.1.self_attn.q_proj", G(32)}};
  auto r = nibble::ReportEngines(c, Shapes(256, 768), false);
  ASSERT_TRUE(r.ok());
  const std::string d = "model.layers.0.mlp.down_proj";
  EXPECT_TRUE(Reading(*r, d, "nibble").agrees);
  EXPECT_TRUE(Reading(*r, d, "transformers").agrees);
  EXPECT_FALSE(Reading(*r, d, "vllm").agrees);  // exact / re: excludes only: quantized
  EXPECT_EQ(Reading(*r, d, "vllm").text, "uint4 per_group g128");
  EXPECT_TRUE(Reading(*r, d, "vllm (fnmatch exclude)").agrees);
  const std::string q = "model.layers.1.self_attn.q_proj";
  EXPECT_EQ(Reading(*r, q, "vllm").text, "fails to load");  // q/k/v fused with different specs
  EXPECT_EQ(Reading(*r, q, "onnxruntime-genai").text, "uint4 per_group g128");  // top-level lookup only
  EXPECT_TRUE(Reading(*r, "model.layers.0.self_attn.q_proj", "onnxruntime-genai").agrees);
  const auto lines = nibble::EngineDisagreementLines(*r);
  ASSERT_FALSE(lines.empty());
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_NE(all.find("avoid: "), std::string::npos);
  EXPECT_NE(all.find("onnxruntime-genai misreads 1 linear"), std::string::npos) << all;

  QuarkQuantConfig sym;
  sym.global = G(128, true);
  sym.export_config.pack_method = nibble::PackMethod::kOrder;
  auto s = nibble::ReportEngines(sym, Shapes(256, 768), true);
  ASSERT_TRUE(s.ok());
  EXPECT_NE(Reading(*s, d, "onnxruntime-genai").why.find("uint4"), std::string::npos);
  EXPECT_EQ(Reading(*s, "lm_head", "vllm").text, "float");  // tied: the embedding runs
  EXPECT_FALSE(Reading(*s, "lm_head", "vllm").agrees);
}

TEST(QuarkTensorParallel, RowAndColumnShardsAsVllmChecks) {
  QuarkQuantConfig c;
  c.global = G(128);
  c.exclude = {"lm_head"};
  // K = 768 for down_proj: 384 at TP 2 (3 groups), 192 at TP 4 (not whole groups).
  auto r = nibble::ReportEngines(c, Shapes(256, 768), false);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->tp.size(), 4u);
  EXPECT_TRUE(r->tp[0].ok);
  EXPECT_TRUE(r->tp[1].ok) << r->tp[1].failure;
  EXPECT_FALSE(r->tp[2].ok);
  EXPECT_NE(r->tp[2].failure.find("o_proj"), std::string::npos) << r->tp[2].failure;  // K = 256 -> 64
  auto err = nibble::CheckTensorParallel(c, Shapes(256, 768), 4);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().message.find("sizes that work: 1, 2"), std::string::npos) << err.error().message;
  // Column-parallel: N = 172 at TP 2 is 86 outputs, not whole packed words.
  c.global = G(4);
  auto col = nibble::TensorParallelFailure(nibble::QuarkSpecResolver(c), Shapes(256, 172), 2);
  ASSERT_TRUE(col.ok());
  EXPECT_NE(col->find("gate_proj"), std::string::npos) << *col;
  EXPECT_NE(col->find("multiple of 8"), std::string::npos) << *col;
}

}  // namespace
