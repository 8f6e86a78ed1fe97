// AWQ settings and their Quark `algo_config` form (SPEC §1.2, §2.1): the scaling_layers mappings,
// the grid, clipping, propagation — parsed and validated once, here, into enums.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "model/config.h"
#include "quantize/pipeline.h"

namespace nibble {

/// One Quark AWQ `scaling_layers` entry (SPEC §1.2), names relative to a decoder layer
/// ("input_layernorm", "self_attn.q_proj", ...).
struct AwqMapping {
  std::string prev_op;              // the smooth layer: an RMSNorm or a Linear
  std::vector<std::string> layers;  // the balance layers (fed by prev_op's output)
  std::string inp;                  // the module whose input is the statistic (layers[0] by default)
  std::string module2inspect;       // "self_attn" | "mlp" | "" (= the single balance layer)
  bool operator==(const AwqMapping&) const = default;
};

/// Quark's AWQ_MAP["llama"] scaling layers: input_layernorm → q/k/v (inspect self_attn);
/// self_attn.v_proj → o_proj; post_attention_layernorm → gate/up (inspect mlp); mlp.up_proj →
/// down_proj.
std::vector<AwqMapping> DefaultLlamaScalingLayers();

/// llm-compressor's duo_scaling: the grid's candidates with duo scaling (x^r / w^(1-r)), without
/// (x^r), or both.
enum class DuoScaling { kTrue, kFalse, kBoth };
/// Parses "true" | "false" | "both". Errors name `what` and the allowed values.
Result<DuoScaling> ParseDuoScaling(const std::string& text, const std::string& what);
const char* DuoScalingName(DuoScaling d);

struct AwqSettings {
  std::vector<AwqMapping> scaling_layers = DefaultLlamaScalingLayers();
  DuoScaling duo_scaling = DuoScaling::kTrue;
  int64_t n_grid = 20;               // >= 2; >= 4 with kBoth
  bool clip = false;                 // AutoAWQ clip search (SPEC §2.3)
  Propagation propagation = Propagation::kFp;
  // Stop evaluating a grid candidate once its partial squared error over the calibration chunks
  // exceeds the best full loss so far (it cannot win): the same choice and output bytes as the
  // full search. false runs every candidate to the end (for tests).
  bool early_stop = true;
  // A mapping that inspects one linear (up_proj -> down_proj, v_proj -> o_proj) scores each
  // candidate Ŵ as Σ_n d_n G d_nᵀ / (rows · N), d = Ŵ − W, G = XᵀX of the linear's calibration
  // inputs X (computed once per mapping, double sums of fp32 products): the MSE of X·Ŵᵀ against
  // X·Wᵀ without a pass over the activations per candidate. false evaluates X·Ŵᵀ per candidate
  // (the direct loss, for tests; the two agree to ~1e-7 relative).
  bool gram_linear_loss = true;
  // LayerRunner's reuse of a layer's attention stages across mappings (false recomputes them,
  // for tests; the values are the same).
  bool reuse_attention = true;
};

/// How errors name the settings a run validates: by the flag that gave each, or by the key of
/// the algo_config entry that overrode it (ApplyAwqAlgoConfig).
struct AwqSettingNames {
  std::string n_grid = "--n_grid";
  std::string duo_scaling = "--duo_scaling";
};

/// Checks n_grid against duo_scaling: once per run, on the settings as they run. Errors name the
/// settings as `names` does.
Status ValidateAwqSettings(const AwqSettings& s, const AwqSettingNames& names = {});

/// Applies the AWQ entry of a Quark `algo_config` (`entry`, found by FindAlgoConfigEntry; `where`
/// names it in errors, "algo_config[i]") onto `s`, key by key: scaling_layers (prev_op, layers, inp,
/// module2inspect; extra keys such as has_kwargs ignored) and nibble's keys duo_scaling, n_grid,
/// clip, propagation; `names` gets the key of each validated setting it gave. Parses only (ValidateAwqSettings checks the
/// result). Errors name the key: a non-list scaling_layers, an entry without string prev_op or a
/// non-empty string list layers, a value of the wrong type, an unknown duo_scaling / propagation.
Status ApplyAwqAlgoConfig(const nlohmann::ordered_json& entry, const std::string& where, AwqSettings& s,
                          AwqSettingNames& names);

/// The Quark `algo_config` list written to config.json: [{"name": "awq", "scaling_layers": the
/// mappings actually used (skipped ones left out), "model_decoder_layers": "model.layers",
/// "num_attention_heads", "num_key_value_heads", and nibble's settings duo_scaling, n_grid, clip,
/// propagation}].
nlohmann::ordered_json AwqAlgoConfigJson(const AwqSettings& s, const std::vector<AwqMapping>& used,
                                         const ModelConfig& mc);

}  // namespace nibble
