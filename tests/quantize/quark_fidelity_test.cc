// Quark checkpoints as real exports and other engines have them: both tensor spellings, unread
// tensors, non-finite weights, tied embeddings, the exclude / override rules of the flags, the
// calibration record, the canonical config written for every README flag combination (checked
// with an exact-name-only matcher written here) and the --tp refusal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "formats/checkpoint_format.h"
#include "formats/quark_config.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "test_paths.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;
using Tensors = std::vector<nibble::TensorToWrite>;

void CopyModel(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))
    if (e.is_regular_file()) fs::copy_file(e.path(), fs::path(to) / e.path().filename());
}

// Rewrites dir/model.safetensors through `edit` (every tensor copied into memory first).
void EditTensors(const std::string& dir, const std::function<void(Tensors&)>& edit) {
  Tensors ts;
  {
    auto st = nibble::TensorStore::OpenDir(dir);
    ASSERT_TRUE(st.ok()) << st.error().message;
    for (const auto& n : st->Names()) {
      const auto* t = st->Find(n);
      ts.push_back({t->name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
    }
  }
  edit(ts);
  std::vector<const nibble::TensorToWrite*> ptrs;
  for (const auto& t : ts) ptrs.push_back(&t);
  ASSERT_TRUE(nibble::WriteSafetensors(dir + "/model.safetensors", ptrs, {}).ok());
}

nlohmann::ordered_json ReadConfig(const std::string& dir) {
  std::ifstream f(dir + "/config.json");
  return nlohmann::ordered_json::parse(f);
}

void EditConfig(const std::string& dir, const std::function<void(nlohmann::ordered_json&)>& edit) {
  nlohmann::ordered_json j = ReadConfig(dir);
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

std::vector<float> Logits(const std::string& dir, std::vector<std::string>* warnings = nullptr) {
  auto m = nibble::Model::Load(dir);
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (!m.ok()) return {};
  if (warnings) *warnings = (*m)->info().warnings;
  auto l = (*m)->Logits({1, 17, 300, 42, 7});
  EXPECT_TRUE(l.ok());
  return l.ok() ? *l : std::vector<float>{};
}

std::string Quantize(const std::string& out, nibble::QuantizeRequest r, const std::string& in = nibble_test::EmbeddedModel()) {
  r.model_dir = in;
  r.output_dir = out;
  r.overwrite = true;
  auto s = nibble::Quantize(r);
  std::string msgs;
  if (!s.ok()) return "error: " + s.error().message;
  for (const auto& m : s->messages) msgs += m + "\n";
  return msgs;
}

std::string LoadError(const std::string& dir) {
  auto m = nibble::Model::Load(dir);
  return m.ok() ? std::string() : m.error().message;
}

TEST(QuarkSpellings, QuantizerSubmoduleNamesLoadTheSameNumbers) {
  TempDir tmp;
  const std::string flat = tmp.sub("flat"), sub = tmp.sub("sub");
  ASSERT_EQ(Quantize(flat, {}).rfind("error", 0), std::string::npos);
  CopyModel(flat, sub);
  EditTensors(sub, [](Tensors& ts) {
    for (auto& t : ts) {
      if (t.name.ends_with(".weight_scale")) t.name.replace(t.name.size() - 13, 13, ".weight_quantizer.scale");
      if (t.name.ends_with(".weight_zero_point")) t.name.replace(t.name.size() - 18, 18, ".weight_quantizer.zero_point");
    }
  });
  std::vector<std::string> warnings;
  EXPECT_EQ(Logits(flat), Logits(sub, &warnings));
  EXPECT_TRUE(warnings.empty());

  // Both spellings of one tensor: a named error.
  EditTensors(sub, [](Tensors& ts) {
    for (const auto& t : Tensors(ts))
      if (t.name == "model.layers.2.mlp.up_proj.weight_quantizer.scale") {
        ts.push_back(t);
        ts.back().name = "model.layers.2.mlp.up_proj.weight_scale";
      }
  });
  const std::string both = LoadError(sub);
  EXPECT_NE(both.find("model.layers.2.mlp.up_proj.weight_scale and model.layers.2.mlp.up_proj.weight_quantizer.scale"),
            std::string::npos) << both;
}

TEST(QuarkSpellings, UnreadTensorsAreErrorsNextToQuantizedModulesElseWarnings) {
  TempDir tmp;
  const std::string q = tmp.sub("q");
  ASSERT_EQ(Quantize(q, {}).rfind("error", 0), std::string::npos);
  EditTensors(q, [](Tensors& ts) { ts.push_back({"model.rotary_emb.inv_freq", nibble::DType::kF32, {4}, std::vector<uint8_t>(16)}); });
  std::vector<std::string> warnings;
  EXPECT_FALSE(Logits(q, &warnings).empty());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("model.rotary_emb.inv_freq"), std::string::npos) << warnings[0];
  EditTensors(q, [](Tensors& ts) { ts.push_back({"model.layers.0.mlp.up_proj.weight_scale_2", nibble::DType::kF32, {4}, std::vector<uint8_t>(16)}); });
  const std::string err = LoadError(q);
  EXPECT_NE(err.find("tensor model.layers.0.mlp.up_proj.weight_scale_2 of quantized module model.layers.0.mlp.up_proj"),
            std::string::npos) << err;
  // A missing scale names both spellings.
  EditTensors(q, [](Tensors& ts) {
    std::erase_if(ts, [](const auto& t) { return t.name == "model.layers.1.mlp.up_proj.weight_scale" || t.name.ends_with("_2"); });
  });
  const std::string missing = LoadError(q);
  EXPECT_NE(missing.find("model.layers.1.mlp.up_proj.weight_scale: missing"), std::string::npos) << missing;
  EXPECT_NE(missing.find("nor is it stored as model.layers.1.mlp.up_proj.weight_quantizer.scale"), std::string::npos) << missing;
}

TEST(QuarkNonFinite, DenseWeightsAreCheckedAtLoadNamingTensorAndIndex) {
  TempDir tmp;
  const std::string d = tmp.sub("d");
  CopyModel(nibble_test::EmbeddedModel(), d);
  EditTensors(d, [](Tensors& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.3.mlp.gate_proj.weight") {
        ASSERT_EQ(t.dtype, nibble::DType::kBF16);
        const uint16_t nan = 0x7fc0, inf = 0x7f80;
        std::memcpy(t.bytes.data() + 2 * (5 * t.shape[1] + 9), &nan, 2);  // [5, 9]
        std::memcpy(t.bytes.data() + 2 * (7 * t.shape[1] + 1), &inf, 2);
      }
  });
  const std::string err = LoadError(d);
  EXPECT_NE(err.find("\"model.layers.3.mlp.gate_proj.weight\" holds nan at index [5, 9]"), std::string::npos) << err;
  EXPECT_NE(Quantize(tmp.sub("q"), {}, d).find("holds nan at index [5, 9]"), std::string::npos);
}

TEST(QuarkTied, LmHeadRulesForTiedModels) {
  TempDir tmp;
  const std::string tied = tmp.sub("tied");
  CopyModel(nibble_test::EmbeddedModel(), tied);
  EditConfig(tied, [](auto& j) { j["tie_word_embeddings"] = true; });
  // A tied lm_head that differs from the embedding: warned, the embedding runs (as Transformers).
  std::vector<std::string> warnings;
  const std::vector<float> with_head = Logits(tied, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("uses model.embed_tokens.weight"), std::string::npos) << warnings[0];
  const std::string headless = tmp.sub("headless");
  CopyModel(tied, headless);
  EditTensors(headless, [](Tensors& ts) { std::erase_if(ts, [](const auto& t) { return t.name == "lm_head.weight"; }); });
  EXPECT_EQ(with_head, Logits(headless));

  // Quantizing the tied lm_head unties the output.
  nibble::QuantizeRequest all;
  all.exclude_layers.clear();
  all.exclude_layers_given = true;
  const std::string qm = Quantize(tmp.sub("q"), all, tied);
  ASSERT_EQ(qm.rfind("error", 0), std::string::npos) << qm;
  EXPECT_NE(qm.find("lm_head.weight differs from model.embed_tokens.weight"), std::string::npos) << qm;
  EXPECT_EQ(ReadConfig(tmp.sub("q"))["tie_word_embeddings"], false);
  EXPECT_TRUE(LoadError(tmp.sub("q")).empty());

  // No lm_head tensor: quantizing everything quantizes the embedding as the head, untied.
  const std::string hall = tmp.sub("hall");
  const std::string qh = Quantize(hall, all, headless);
  EXPECT_NE(qh.find("lm_head: tie_word_embeddings is true; quantized from model.embed_tokens.weight and written untied"),
            std::string::npos) << qh;
  EXPECT_EQ(ReadConfig(hall)["tie_word_embeddings"], false);
  EXPECT_EQ(ReadConfig(hall)["quantization_config"]["exclude"], nlohmann::ordered_json::array());
  EXPECT_TRUE(LoadError(hall).empty());
  // Kept float (the default): the written config excludes lm_head, stays tied, and one that
  // declares it quantized is refused at load.
  const std::string h = tmp.sub("hq");
  ASSERT_EQ(Quantize(h, {}, headless).rfind("error", 0), std::string::npos);
  EXPECT_EQ(ReadConfig(h)["quantization_config"]["exclude"], nlohmann::ordered_json::array({"lm_head"}));
  EXPECT_EQ(ReadConfig(h)["tie_word_embeddings"], true);
  EXPECT_TRUE(LoadError(h).empty());
  EditConfig(h, [](auto& j) { j["quantization_config"]["exclude"] = nlohmann::ordered_json::array(); });
  const std::string err = LoadError(h);
  EXPECT_NE(err.find("declares lm_head quantized"), std::string::npos) << err;
  EXPECT_NE(err.find("no lm_head tensor"), std::string::npos) << err;
}

TEST(QuarkFlags, ExcludeOverridesAndCalibrationRecord) {
  TempDir tmp;
  nibble::QuantizeRequest none;  // `--exclude_layers` with no value
  none.exclude_layers = {""};
  none.exclude_layers_given = true;
  const std::string msgs = Quantize(tmp.sub("none"), none);
  EXPECT_EQ(ReadConfig(tmp.sub("none"))["quantization_config"]["exclude"], nlohmann::ordered_json::array());
  EXPECT_NE(msgs.find("replaces the default lm_head exclusion"), std::string::npos) << msgs;

  nibble::QuantizeRequest head;  // the README's example: an explicit override beats the default
  head.layer_quant_config = {"lm_head:group_size=32"};
  const std::string hm = Quantize(tmp.sub("head"), head);
  EXPECT_NE(hm.find("lifts the default lm_head exclusion"), std::string::npos) << hm;
  auto rep = nibble::Inspect(tmp.sub("head"));
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->layers.back().name, "lm_head");
  EXPECT_EQ(rep->layers.back().scheme, "uint4 per_group g32");
  head.exclude_layers_given = true;  // --exclude_layers lm_head given: exclude wins, and says why
  const std::string hx = Quantize(tmp.sub("headx"), head);
  EXPECT_NE(hx.find("decides no layer: lm_head is excluded by \"lm_head\""), std::string::npos) << hx;

  nibble::QuantizeRequest awq;
  awq.quant_algo = "awq";
  awq.dataset = nibble_test::SourceDir() + "/models/prose-llama-7m/README.md";
  awq.num_calib_data = 2;
  awq.seq_len = 32;
  awq.seed = 3;
  awq.n_grid = 2;
  const std::string am = Quantize(tmp.sub("awq"), awq);
  ASSERT_EQ(am.rfind("error", 0), std::string::npos) << am;
  const auto cal = ReadConfig(tmp.sub("awq"))["quantization_config"]["calibration"];
  EXPECT_EQ(cal["dataset"], "README.md");
  EXPECT_EQ(cal["dataset_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(cal["num_calib_data"], 2);
  EXPECT_EQ(cal["seq_len"], 32);
  EXPECT_EQ(cal["seed"], 3);
  EXPECT_EQ(cal["propagation"], "fp");
  EXPECT_TRUE(LoadError(tmp.sub("awq")).empty());
  EXPECT_FALSE(ReadConfig(tmp.sub("none"))["quantization_config"].contains("calibration"));
  nibble::QuantizeRequest again;  // a config taken from that export records no calibration of its own
  again.quant_config_file = tmp.sub("awq") + "/config.json";
  const std::string ag = Quantize(tmp.sub("again"), again);
  ASSERT_EQ(ag.rfind("error", 0), std::string::npos) << ag;
  EXPECT_FALSE(ReadConfig(tmp.sub("again"))["quantization_config"].contains("calibration"));
}

// The independent model of ONNX Runtime GenAI's group size: layer_quant_config[top-level name]
// when that key exists, else the global spec.
int64_t OrtGroup(const nlohmann::ordered_json& q, const std::string& name) {
  const std::string top = name.substr(0, name.find('.'));
  const auto& lq = q["layer_quant_config"];
  const auto& w = lq.contains(top) ? lq[top]["weight"] : q["global_quant_config"]["weight"];
  return w["group_size"].is_null() ? -1 : w["group_size"].get<int64_t>();
}

// The independent model of exact-name-only resolution: exclude by equality, per-layer specs by
// exact key, else the global spec (dtype and group size compared).
std::string ExactOnly(const nlohmann::ordered_json& q, const std::string& name) {
  auto text = [](const nlohmann::ordered_json& cfg) -> std::string {
    const auto& w = cfg["weight"];
    if (w.is_null()) return "float";
    return w["dtype"].get<std::string>() + " g" + (w["group_size"].is_null() ? "row" : std::to_string(w["group_size"].get<int64_t>()));
  };
  for (const auto& e : q["exclude"])
    if (e == name) return "float";
  for (auto it = q["layer_quant_config"].begin(); it != q["layer_quant_config"].end(); ++it)
    if (it.key() == name) return text(it.value());
  return text(q["global_quant_config"]);
}

TEST(QuarkCanonicalExport, ReadmeFlagCombinationsResolveAlikeByExactName) {
  TempDir tmp;
  struct Case {
    std::vector<std::string> exclude;
    std::vector<std::string> overrides;
    std::string scheme = "w_uint4_per_group_asym";
    int64_t g = 128;
    bool ort_expressible = false;  // no per-layer group size inside decoder layers
  };
  const std::vector<Case> cases = {
      {{"lm_head"}, {}, "w_uint4_per_group_asym", 128, true},
      {{}, {}, "w_uint4_per_group_asym", 64, true},
      {{"lm_head", "*.mlp.down_proj"}, {}, "w_uint4_per_group_asym", 128, true},
      {{}, {"model.layers.*:group_size=64"}, "w_uint4_per_group_asym", 128, true},
      {{"re:model\\.layers\\.[12]\\..*"}, {"*down_proj:group_size=32"}},
      {{"lm_head"}, {"model.layers.0.*:group_size=64,quant_scheme=w_int4_per_group_sym", "lm_head:group_size=32"}},
      {{"lm_head"}, {"model.layers.1.mlp.down_proj,model.layers.2.mlp.down_proj:group_size=32"}, "w_int4_per_group_sym", 64},
      {{"lm_head"}, {}, "w_uint4_per_channel_asym"},
  };
  int i = 0;
  for (const Case& c : cases) {
    nibble::QuantizeRequest r;
    r.exclude_layers = c.exclude;
    r.exclude_layers_given = true;
    r.layer_quant_config = c.overrides;
    r.quant_scheme = c.scheme;
    r.group_size = c.g;
    const std::string out = tmp.sub("c" + std::to_string(i++));
    const std::string msgs = Quantize(out, r);
    ASSERT_EQ(msgs.rfind("error", 0), std::string::npos) << msgs;
    const auto q = ReadConfig(out)["quantization_config"];
    auto rep = nibble::Inspect(out);
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    for (const auto& l : rep->layers) {
      std::string nibble_says = l.quantized ? l.scheme : "float";
      // "uint4 per_group g128" / "int4 per_channel" -> the matcher's "uint4 g128" / "int4 grow".
      nibble_says = nibble_says == "float" ? nibble_says
                    : nibble_says.substr(0, nibble_says.find(' ')) + " g" +
                          (nibble_says.find("per_channel") != std::string::npos ? "row" : nibble_says.substr(nibble_says.rfind('g') + 1));
      EXPECT_EQ(nibble_says, ExactOnly(q, l.name)) << "case " << i - 1 << ": " << l.name;
      if (c.ort_expressible && l.quantized) {
        EXPECT_EQ("g" + std::to_string(OrtGroup(q, l.name)), nibble_says.substr(nibble_says.find(' ') + 1))
            << "case " << i - 1 << ": " << l.name;
      }
    }
    for (const auto& e : q["exclude"]) EXPECT_EQ(e.get<std::string>().find_first_of("*?[,"), std::string::npos) << e;
    for (auto it = q["layer_quant_config"].begin(); it != q["layer_quant_config"].end(); ++it)
      EXPECT_EQ(it.key().find_first_of("*?[,"), std::string::npos) << it.key();
  }
}

TEST(QuarkTensorParallelExport, TpRefusesUpFrontNamingTheLayer) {
  TempDir tmp;
  nibble::QuantizeRequest r;
  r.tp = 4;
  const std::string err = Quantize(tmp.sub("tp"), r);
  EXPECT_NE(err.find("--tp 4: model.layers.0.self_attn.o_proj"), std::string::npos) << err;
  EXPECT_NE(err.find("sizes that work: 1, 2"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp.sub("tp")));
  r.tp = 2;
  EXPECT_EQ(Quantize(tmp.sub("tp"), r).rfind("error", 0), std::string::npos);
}

}  // namespace
