// Quark quantization_config: parsing (current and legacy forms), errors naming keys, ToJson key
// set and round trip, and layer resolution (SPEC §1.2, §1.3, TV-6).
#include "formats/quark_config.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace nibble {
namespace {

using OJ = nlohmann::ordered_json;

// Compile-time: the sorted-key nlohmann::json overload is deleted (it would lose pattern order).
template <typename J>
concept Parsable = requires(const J& j) { ParseQuarkQuantConfig(j, std::string()); };
static_assert(!Parsable<nlohmann::json>);
static_assert(Parsable<OJ>);

// SPEC §1.2 "complete minimal example" (algo_config trimmed to one scaling layer).
const char* kSpecExample = R"({
  "quant_method": "quark",
  "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
             "weight_format": "real_quantized", "weight_merge_groups": null},
  "global_quant_config": {
    "input_tensors": null, "output_tensors": null, "bias": null, "target_device": null,
    "weight": {"dtype": "uint4", "is_dynamic": false, "qscheme": "per_group", "ch_axis": 1,
               "group_size": 128, "symmetric": false, "round_method": "half_even",
               "scale_type": "float", "observer_cls": "PerGroupMinMaxObserver"}},
  "layer_quant_config": {}, "layer_type_quant_config": {}, "kv_cache_quant_config": {},
  "exclude": ["lm_head"], "algo_config": [{"name": "awq", "model_decoder_layers": "model.layers",
               "scaling_layers": [{"prev_op": "model.layers.0.input_layernorm", "layers": ["q"], "inp": "q"}]}],
  "softmax_quant_spec": null, "quant_mode": "eager_mode", "version": "0.9"
})";

OJ Example() { return OJ::parse(kSpecExample); }

Result<QuarkQuantConfig> Parse(const OJ& j) { return ParseQuarkQuantConfig(j, "config.json: quantization_config"); }

// Expects a parse error whose message contains every fragment.
void ExpectError(const OJ& j, const std::vector<std::string>& fragments) {
  auto r = Parse(j);
  ASSERT_FALSE(r.ok()) << "parsed unexpectedly: " << j.dump();
  for (const auto& f : fragments) EXPECT_NE(r.error().message.find(f), std::string::npos) << "missing \"" << f << "\" in: " << r.error().message;
  EXPECT_EQ(r.error().message.rfind("config.json: quantization_config: ", 0), 0u) << r.error().message;
}

WeightQuantSpec Uint4(int64_t g) {
  WeightQuantSpec s;
  s.group_size = g;
  return s;
}

WeightQuantSpec Int4Sym(int64_t g) {
  WeightQuantSpec s;
  s.dtype = QuantDType::kInt4;
  s.symmetric = true;
  s.group_size = g;
  return s;
}

TEST(QuantConfigTest, ParsesSpecExample) {
  auto r = Parse(Example());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const QuarkQuantConfig& c = *r;
  ASSERT_TRUE(c.global.has_value());
  EXPECT_EQ(c.global->dtype, QuantDType::kUint4);
  EXPECT_EQ(c.global->qscheme, QScheme::kPerGroup);
  EXPECT_EQ(c.global->group_size, 128);
  EXPECT_EQ(c.global->ch_axis, 1);
  EXPECT_FALSE(c.global->symmetric);
  EXPECT_EQ(c.global->round_method, "half_even");
  EXPECT_EQ(c.global->observer_cls, std::optional<std::string>("PerGroupMinMaxObserver"));
  EXPECT_FALSE(c.global->scale_format.has_value());  // older 9-key export
  EXPECT_TRUE(c.layer_quant_config.empty());
  EXPECT_TRUE(c.layer_type_quant_config.empty());
  EXPECT_EQ(c.exclude, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(c.export_config.pack_method, PackMethod::kReorder);
  EXPECT_EQ(c.export_config.weight_format, WeightFormat::kRealQuantized);
  EXPECT_FALSE(c.export_config.weight_merge_groups.has_value());
  ASSERT_TRUE(c.algo_config.is_array());
  EXPECT_EQ(c.algo_config[0]["name"], "awq");
  EXPECT_EQ(c.quant_mode, "eager_mode");
  EXPECT_EQ(c.version, std::optional<std::string>("0.9"));
}

TEST(QuantConfigTest, AcceptsLegacyForms) {
  OJ j = Example();
  j["layer_quant_config"] = nullptr;
  j["layer_type_quant_config"] = nullptr;
  j["kv_cache_quant_config"] = nullptr;
  j["exclude"] = nullptr;
  j["algo_config"] = OJ::parse(R"({"name": "awq", "model_decoder_layers": "model.layers"})");
  j.erase("quant_mode");
  j.erase("version");
  j.erase("softmax_quant_spec");
  j["global_quant_config"].erase("target_device");
  j["export"] = OJ::parse(R"({"pack_method": "order"})");  // other export keys take dataclass defaults
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->layer_quant_config.empty());
  EXPECT_TRUE(r->exclude.empty());
  ASSERT_TRUE(r->algo_config.is_array());  // a legacy single object is wrapped in a list
  ASSERT_EQ(r->algo_config.size(), 1u);
  EXPECT_EQ(r->algo_config[0]["name"], "awq");
  EXPECT_EQ(r->quant_mode, "eager_mode");
  EXPECT_FALSE(r->version.has_value());
  EXPECT_EQ(r->export_config.pack_method, PackMethod::kOrder);
  EXPECT_EQ(r->export_config.weight_format, WeightFormat::kRealQuantized);
}

TEST(QuantConfigTest, ErrorsNameTheKey) {
  OJ j = Example();
  j["global_quant_config"]["weight"]["dtype"] = "int3";
  ExpectError(j, {"global_quant_config.weight.dtype", "\"int3\"", "\"int4\" or \"uint4\""});

  j = Example();
  j["global_quant_config"]["weight"]["group_size"] = 0;
  ExpectError(j, {"global_quant_config.weight.group_size", "invalid value 0"});
  j["global_quant_config"]["weight"]["group_size"] = -2;
  ExpectError(j, {"global_quant_config.weight.group_size", "invalid value -2"});
  j["global_quant_config"]["weight"]["group_size"] = 128.0;
  ExpectError(j, {"global_quant_config.weight.group_size", "expected an integer", "found number 128.0"});
  j["global_quant_config"]["weight"]["group_size"] = "128";
  ExpectError(j, {"global_quant_config.weight.group_size", "expected an integer", "found string"});
  j["global_quant_config"]["weight"]["group_size"] = nullptr;
  ExpectError(j, {"global_quant_config.weight.group_size", "null"});

  j = Example();
  j["export"]["pack_method"] = "zigzag";
  ExpectError(j, {"export.pack_method", "\"zigzag\"", "\"reorder\" or \"order\""});
  j = Example();
  j["export"]["weight_format"] = "packed";
  ExpectError(j, {"export.weight_format", "\"packed\"", "real_quantized"});
  j = Example();
  j.erase("export");
  ExpectError(j, {"export", "missing"});
  j = Example();
  j["quant_method"] = "awq";
  ExpectError(j, {"quant_method", "\"quark\"", "\"awq\""});

  j = Example();
  j["global_quant_config"]["input_tensors"] = OJ::parse(R"({"dtype": "int8", "qscheme": "per_tensor"})");
  ExpectError(j, {"global_quant_config.input_tensors", "not W4A16, unsupported"});
  j = Example();
  j["global_quant_config"]["output_tensors"] = OJ::parse(R"({"dtype": "fp8_e4m3"})");
  ExpectError(j, {"global_quant_config.output_tensors", "unsupported"});

  j = Example();
  j["global_quant_config"]["weight"]["symmetric"] = true;  // uint4 + symmetric
  ExpectError(j, {"global_quant_config.weight", "unsupported combination"});
  j["global_quant_config"]["weight"].erase("symmetric");
  ExpectError(j, {"global_quant_config.weight.symmetric", "missing"});
  j = Example();
  j["global_quant_config"]["weight"]["symmetric"] = "false";
  ExpectError(j, {"global_quant_config.weight.symmetric", "expected a boolean", "found string"});
  j = Example();
  j["global_quant_config"]["weight"]["qscheme"] = "per_tensor";
  ExpectError(j, {"global_quant_config.weight.qscheme", "\"per_tensor\""});
  j = Example();
  j["global_quant_config"]["weight"]["ch_axis"] = 0;
  ExpectError(j, {"global_quant_config.weight.ch_axis", "expected 1"});
  j = Example();
  j["global_quant_config"]["weight"] = OJ::array({j["global_quant_config"]["weight"]});
  ExpectError(j, {"global_quant_config.weight", "multi-stage"});

  j = Example();
  j["layer_quant_config"] = OJ::parse(R"({"*down_proj": {"weight": {"dtype": "int8", "qscheme": "per_group",
      "group_size": 128, "symmetric": true}}})");
  ExpectError(j, {"layer_quant_config[\"*down_proj\"].weight.dtype", "\"int8\""});
  j = Example();
  j["exclude"] = "lm_head";
  ExpectError(j, {"exclude", "expected a list of strings", "found string"});
  j = Example();
  j["exclude"] = OJ::array({"lm_head", 3});
  ExpectError(j, {"exclude[1]", "expected a string"});
  j = Example();
  j["exclude"] = OJ::array({"lm_head", "re:(bad"});
  ExpectError(j, {"exclude[1]", "re:(bad", "invalid regular expression"});
  j = Example();
  j["kv_cache_quant_config"] = OJ::parse(R"({"*k_proj": {"output_tensors": {"dtype": "fp8_e4m3"}}})");
  ExpectError(j, {"kv_cache_quant_config", "not supported"});
  j = Example();
  j["algo_config"] = "awq";
  ExpectError(j, {"algo_config", "found string"});
  j = Example();
  j["export"]["min_kv_scale"] = "0";
  ExpectError(j, {"export.min_kv_scale", "expected a number"});
}

// A hand-written --quant_config: a misspelt key is an error naming its path and the closest key.
TEST(QuantConfigTest, UnknownKeysNameTheClosest) {
  EXPECT_TRUE(CheckQuarkConfigKeys(Example(), "q.json").ok());
  struct Case {
    std::function<void(OJ&)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {[](OJ& j) { j["exlcude"] = j["exclude"]; }, {"q.json: exlcude: unknown key", "did you mean \"exclude\""}},
      {[](OJ& j) { j["export"]["pack_metod"] = "order"; }, {"export.pack_metod", "\"pack_method\""}},
      {[](OJ& j) { j["global_quant_config"]["weight"]["groupsize"] = 32; },
       {"global_quant_config.weight.groupsize", "\"group_size\""}},
      {[](OJ& j) { j["layer_quant_config"]["*.down_proj"] = {{"wieght", nullptr}}; },
       {"layer_quant_config[\"*.down_proj\"].wieght", "\"weight\""}},
      {[](OJ& j) { j["zzzzzzzzzz"] = 1; }, {"zzzzzzzzzz: unknown key"}},
  };
  for (const Case& c : cases) {
    OJ j = Example();
    c.edit(j);
    const Status s = CheckQuarkConfigKeys(j, "q.json");
    ASSERT_FALSE(s.ok()) << c.fragments[0];
    for (const auto& f : c.fragments) EXPECT_NE(s.error().message.find(f), std::string::npos) << s.error().message;
  }
  OJ j = Example();
  j["zzzzzzzzzz"] = 1;
  EXPECT_EQ(CheckQuarkConfigKeys(j, "q.json").error().message.find("did you mean"), std::string::npos);
}

TEST(QuantConfigTest, NotAnObject) {
  auto r = Parse(OJ::array());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("expected a quantization_config object"), std::string::npos);
}

QuarkQuantConfig RichConfig() {
  QuarkQuantConfig c;
  c.global = Uint4(128);
  WeightQuantSpec per_channel = Int4Sym(-1);
  per_channel.qscheme = QScheme::kPerChannel;
  per_channel.ch_axis = 0;
  per_channel.observer_cls = "PerChannelMinMaxObserver";
  // Deliberately not in sorted order, to check that order survives.
  c.layer_quant_config.emplace_back("model.layers.1.*", Int4Sym(32));
  c.layer_quant_config.emplace_back("*down_proj", per_channel);
  c.layer_quant_config.emplace_back("*o_proj", std::nullopt);
  c.layer_type_quant_config.emplace("Linear", Uint4(64));
  c.exclude = {"lm_head", "re:.*vision.*"};
  c.export_config.pack_method = PackMethod::kOrder;
  c.export_config.weight_merge_groups = std::vector<std::vector<std::string>>{{"*q_proj", "*k_proj", "*v_proj"}};
  c.export_config.kv_cache_group = {"*k_proj"};
  c.algo_config = OJ::parse(R"([{"name": "awq", "model_decoder_layers": "model.layers"}])");
  c.version = "0.10";
  return c;
}

TEST(QuantConfigTest, RoundTrip) {
  for (const QuarkQuantConfig& c : {RichConfig(), QuarkQuantConfig{}}) {
    const OJ j = ToJson(c);
    auto r = Parse(j);
    ASSERT_TRUE(r.ok()) << r.error().message << "\n" << j.dump(2);
    EXPECT_TRUE(*r == c) << j.dump(2);
    // Through text too (this is how a config.json is read back), order included.
    OJ file = OJ::object();
    file["architectures"] = OJ::array({"LlamaForCausalLM"});
    file["quantization_config"] = j;
    auto t = ParseQuarkQuantConfigFromConfigJson(file.dump(2), "out/config.json");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_TRUE(*t == c);
  }
  // Sanity of the comparison itself: a different pattern order is a different config.
  QuarkQuantConfig a = RichConfig(), b = RichConfig();
  std::swap(b.layer_quant_config[0], b.layer_quant_config[1]);
  EXPECT_FALSE(a == b);
}

std::vector<std::string> Keys(const OJ& j) {
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  return keys;
}

TEST(QuantConfigTest, ToJsonWritesFullQuarkSchema) {
  const OJ j = ToJson(RichConfig());
  EXPECT_EQ(Keys(j), (std::vector<std::string>{"quant_method", "export", "global_quant_config", "layer_quant_config",
                                              "layer_type_quant_config", "kv_cache_quant_config", "exclude",
                                              "algo_config", "softmax_quant_spec", "quant_mode", "version"}));
  EXPECT_EQ(j["quant_method"], "quark");
  EXPECT_EQ(Keys(j["export"]), (std::vector<std::string>{"kv_cache_group", "min_kv_scale", "pack_method",
                                                        "weight_format", "weight_merge_groups"}));
  EXPECT_EQ(j["export"]["pack_method"], "order");
  EXPECT_EQ(j["export"]["min_kv_scale"].dump(), "0.0");
  const OJ& g = j["global_quant_config"];
  EXPECT_EQ(Keys(g), (std::vector<std::string>{"input_tensors", "output_tensors", "weight", "bias", "target_device"}));
  for (const char* k : {"input_tensors", "output_tensors", "bias", "target_device"}) EXPECT_TRUE(g[k].is_null()) << k;
  EXPECT_EQ(Keys(g["weight"]), (std::vector<std::string>{"dtype", "is_dynamic", "qscheme", "ch_axis", "group_size",
                                                        "symmetric", "round_method", "scale_type", "scale_format",
                                                        "scale_calculation_mode", "mx_element_dtype", "observer_cls",
                                                        "is_scale_quant"}));
  EXPECT_EQ(g["weight"].dump(),
            R"({"dtype":"uint4","is_dynamic":false,"qscheme":"per_group","ch_axis":1,"group_size":128,"symmetric":false,)"
            R"("round_method":"half_even","scale_type":"float","scale_format":null,"scale_calculation_mode":null,)"
            R"("mx_element_dtype":null,"observer_cls":"PerGroupMinMaxObserver","is_scale_quant":false})");
  EXPECT_EQ(Keys(j["layer_quant_config"]), (std::vector<std::string>{"model.layers.1.*", "*down_proj", "*o_proj"}));
  EXPECT_TRUE(j["layer_quant_config"]["*o_proj"]["weight"].is_null());
  EXPECT_TRUE(j["layer_quant_config"]["*down_proj"]["weight"]["group_size"].is_null());  // per_channel
  EXPECT_EQ(j["layer_quant_config"]["*down_proj"]["weight"]["ch_axis"], 0);
  EXPECT_TRUE(j["kv_cache_quant_config"].is_object() && j["kv_cache_quant_config"].empty());
  EXPECT_TRUE(j["softmax_quant_spec"].is_null());
  EXPECT_EQ(j["quant_mode"], "eager_mode");
  EXPECT_EQ(j["version"], "0.10");
  EXPECT_FALSE(ToJson(QuarkQuantConfig{}).contains("version"));
}

TEST(QuantConfigTest, ConfigJsonTextKeepsOrderAndRejectsDuplicates) {
  const std::string text = R"({"quantization_config": {"quant_method": "quark", "export": {},
    "global_quant_config": null,
    "layer_quant_config": {
      "model.layers.0.*": {"weight": {"dtype": "int4", "qscheme": "per_group", "group_size": 32, "symmetric": true}},
      "*down_proj": {"weight": {"dtype": "uint4", "qscheme": "per_group", "group_size": 128, "symmetric": false}}}}})";
  auto c = ParseQuarkQuantConfigFromConfigJson(text, "m/config.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->layer_quant_config.size(), 2u);
  EXPECT_EQ(c->layer_quant_config[0].first, "model.layers.0.*");  // not sorted
  auto r = ResolveLayer(*c, "model.layers.0.mlp.down_proj");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rule, "layer_quant_config[\"model.layers.0.*\"]");
  ASSERT_TRUE(r->spec.has_value());
  EXPECT_EQ(r->spec->group_size, 32);
  r = ResolveLayer(*c, "model.layers.2.self_attn.q_proj");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->spec.has_value());  // global_quant_config null: not quantized
  EXPECT_EQ(r->rule, "global_quant_config");

  auto dup = ParseQuarkQuantConfigFromConfigJson(
      R"({"quantization_config": {"quant_method": "quark", "layer_quant_config": {"*a": null, "*a": null}}})", "d.json");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message.find("duplicate key \"*a\""), std::string::npos) << dup.error().message;
  auto none = ParseQuarkQuantConfigFromConfigJson(R"({"architectures": []})", "plain/config.json");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("plain/config.json: no \"quantization_config\""), std::string::npos);
  auto bad = ParseQuarkQuantConfigFromConfigJson("{", "broken.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("broken.json: not valid JSON"), std::string::npos);
  auto nested = ParseQuarkQuantConfigFromConfigJson(
      R"({"quantization_config": {"quant_method": "quark", "export": {"pack_method": "zigzag"}, "global_quant_config": null}})",
      "m/config.json");
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.error().message.rfind("m/config.json: quantization_config: export.pack_method", 0), 0u)
      << nested.error().message;
}

// TV-6: A, B, C distinguished by group size.
QuarkQuantConfig Tv6() {
  QuarkQuantConfig c;
  c.global = Uint4(128);                                 // C
  c.layer_quant_config.emplace_back("*down_proj", Uint4(32));        // A
  c.layer_quant_config.emplace_back("model.layers.0.*", Uint4(64));  // B
  c.exclude = {"lm_head", "*layers.31.mlp.*"};
  return c;
}

void ExpectResolves(const QuarkQuantConfig& c, const std::string& layer, std::optional<int64_t> group, const std::string& rule) {
  auto r = ResolveLayer(c, layer);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->rule, rule) << layer;
  ASSERT_EQ(r->spec.has_value(), group.has_value()) << layer;
  if (group) {
    EXPECT_EQ(r->spec->group_size, *group) << layer;
  }
}

TEST(ResolveLayerTest, Tv6) {
  const QuarkQuantConfig c = Tv6();
  ExpectResolves(c, "model.layers.0.mlp.down_proj", 32, "layer_quant_config[\"*down_proj\"]");
  ExpectResolves(c, "model.layers.0.self_attn.q_proj", 64, "layer_quant_config[\"model.layers.0.*\"]");
  ExpectResolves(c, "model.layers.5.self_attn.q_proj", 128, "global_quant_config");
  ExpectResolves(c, "model.layers.31.mlp.up_proj", std::nullopt, "excluded by \"*layers.31.mlp.*\"");
  ExpectResolves(c, "lm_head", std::nullopt, "excluded by \"lm_head\"");
  ExpectResolves(c, "model.lm_head", 128, "global_quant_config");
}

TEST(ResolveLayerTest, ExcludeWinsAndMatchesWholeNames) {
  QuarkQuantConfig c = Tv6();
  c.exclude = {"*mlp.gate", "re:model\\.layers\\.7\\.", "*down_proj"};
  ExpectResolves(c, "model.layers.2.mlp.gate_proj", 128, "global_quant_config");  // not excluded
  ExpectResolves(c, "model.layers.0.mlp.gate_proj", 64, "layer_quant_config[\"model.layers.0.*\"]");
  ExpectResolves(c, "model.layers.2.mlp.gate", std::nullopt, "excluded by \"*mlp.gate\"");
  ExpectResolves(c, "model.layers.7.self_attn.k_proj", std::nullopt, "excluded by \"re:model\\.layers\\.7\\.\"");
  ExpectResolves(c, "model.layers.0.mlp.down_proj", std::nullopt, "excluded by \"*down_proj\"");  // beats layer_quant_config
}

TEST(ResolveLayerTest, LayerTypeBeforeGlobalAndNullSpecs) {
  QuarkQuantConfig c = Tv6();
  c.layer_type_quant_config.emplace("Linear", Int4Sym(16));
  c.layer_type_quant_config.emplace("Conv2d", Uint4(8));
  c.layer_quant_config.emplace_back("*o_proj", std::nullopt);
  ExpectResolves(c, "model.layers.5.self_attn.q_proj", 16, "layer_type_quant_config[\"Linear\"]");
  ExpectResolves(c, "model.layers.0.mlp.down_proj", 32, "layer_quant_config[\"*down_proj\"]");
  ExpectResolves(c, "model.layers.5.self_attn.o_proj", std::nullopt, "layer_quant_config[\"*o_proj\"]");
}

TEST(ResolveLayerTest, InvalidRegexBuiltInCodeIsAnError) {
  QuarkQuantConfig c = Tv6();
  c.exclude = {"re:[oops"};
  auto r = ResolveLayer(c, "model.layers.0.mlp.up_proj");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("re:[oops"), std::string::npos);
  EXPECT_NE(r.error().message.find("model.layers.0.mlp.up_proj"), std::string::npos);
}

}  // namespace
}  // namespace nibble
