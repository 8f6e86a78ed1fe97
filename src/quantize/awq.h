// AWQ (activation-aware weight quantization) with llm-compressor AWQModifier semantics (SPEC §2.1)
// and Quark `scaling_layers` mappings (SPEC §1.2), run as a sequential pipeline over decoder
// layers; AutoAWQ's weight-clipping search (SPEC §2.3) as an option.
//
// Per decoder layer, in order:
//   1. the layer's fp32 weights are loaded from the store (one layer in memory at a time);
//   2. for each mapping (prev_op → balance layers, inspected module) the activations are computed
//      from the layer input X with the layer's current (already smoothed) weights;
//      x_mean[c] = mean |x[:, c]| of the balance layers' input, w_mean[c] = LC's group-normalised
//      weight mean (duo scaling); candidates of LC's grid (n_grid, duo_scaling true|false|both);
//      for each: s = clamp_min(x^r / (w^(1-r) + 1e-4), 1e-4) (duo) or clamp_min(x^r, 1e-4),
//      s /= sqrt(max s · min s), inf/NaN → 1; every quantized balance layer W → Q(W·s)/s (Quark RTN
//      with the configured scheme, scales in the model dtype); the inspected module is re-run on
//      all calibration tokens; loss = MSE against its output with the unquantized weights. The
//      first candidate with the strictly smallest finite loss wins. All search arithmetic in
//      fp32 (sums in double, over fixed row blocks, so results do not depend on the thread count).
//   3. the best s is applied: balance layers' columns × s, prev_op ÷ s (RMSNorm weight — rounded
//      at once to its stored dtype, since that is what the checkpoint will hold — or the last
//      len(s) output rows and bias of a prev_op Linear);
//   4. optional clip search (AutoAWQ; q/k skipped) on the smoothed weights;
//   5. the next layer's input: fp propagation (default) runs the smoothed, unclipped,
//      unquantized layer; quantized propagation runs the layer with Q(W) dequantized.
// Each finished layer's fp32 weights go to the caller's sink at once (then are freed), so memory
// holds one layer's weights and the calibration activations, never the whole model in fp32. They
// are what the exporter quantizes with RTN (formats/rtn.h): smoothed weights go to RTN unrounded
// (as the reference implementation does); folded norm weights are already rounded to their dtype.
//
// Numerical safety: a candidate whose RTN scale overflows the scale dtype, or that makes a value
// stored in float (an unquantized balance layer, a folded prev_op) overflow its dtype, is rejected
// (never stored as inf); the identity candidate (ratio 0, no duo) is always tried first.
// Non-goals: MoE / fused qkv models, offloading, GELU-style activations between prev_op and layers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "formats/quant_config.h"
#include "io/safetensors.h"
#include "model/config.h"

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

/// Where the next layer's calibration input comes from.
enum class AwqPropagation { kFp, kQuantized };

struct AwqSettings {
  std::vector<AwqMapping> scaling_layers = DefaultLlamaScalingLayers();
  std::string duo_scaling = "true";  // "true" | "false" | "both" (llm-compressor)
  int64_t n_grid = 20;
  bool clip = false;                 // AutoAWQ clip search (SPEC §2.3)
  AwqPropagation propagation = AwqPropagation::kFp;
  // Stop evaluating a grid candidate once its partial squared error over the calibration chunks
  // exceeds the best full loss so far (it cannot win). The chosen scales, and so every output
  // byte, are those of the full search; only the forwards of losing candidates are cut short.
  // false runs every candidate to the end (the full search, for tests).
  bool early_stop = true;
  // A mapping that inspects one linear (up_proj -> down_proj, v_proj -> o_proj) scores each
  // candidate Ŵ as Σ_n d_n G d_nᵀ / (rows · N), d = Ŵ − W, G = XᵀX of the linear's calibration
  // inputs X (computed once per mapping, double sums of fp32 products): the MSE of X·Ŵᵀ against
  // X·Wᵀ without a pass over the activations per candidate. false evaluates X·Ŵᵀ per candidate
  // (the direct loss, for tests; the two agree to ~1e-7 relative).
  bool gram_linear_loss = true;
  // Within a layer, a mapping (and the final fp pass) that needs the MLP stages reuses the
  // attention stages computed for an earlier mapping when no mapping since has rescaled
  // input_layernorm or q / k / v / o (the values are the same as recomputed). false recomputes
  // them every time (for tests).
  bool reuse_attention = true;
};

/// Parses the AWQ entry of a Quark `algo_config` (a list, or a legacy single object): the entry
/// whose "name" is "awq". Reads scaling_layers (prev_op, layers, inp, module2inspect; extra keys
/// such as has_kwargs ignored) and nibble's optional keys duo_scaling, n_grid, clip,
/// propagation; keys that are absent keep their value from `defaults`. Returns nullopt when
/// algo_config is null or holds no "awq" entry.
/// Errors name the key: a non-list scaling_layers, an entry without string prev_op or a
/// non-empty string list layers, an unknown duo_scaling / propagation, n_grid < 2.
Result<std::optional<AwqSettings>> ParseAwqAlgoConfig(const nlohmann::ordered_json& algo_config,
                                                      const AwqSettings& defaults = AwqSettings());

/// The Quark `algo_config` list written to config.json: [{"name": "awq", "scaling_layers": the
/// mappings actually used (skipped ones left out), "model_decoder_layers": "model.layers",
/// "num_attention_heads", "num_key_value_heads", and nibble's settings duo_scaling, n_grid, clip,
/// propagation}].
nlohmann::ordered_json AwqAlgoConfigJson(const AwqSettings& s, const std::vector<AwqMapping>& used,
                                         const ModelConfig& mc);

/// Per-mapping outcome for the report.
struct AwqMappingReport {
  AwqMapping mapping;
  bool skipped = false;
  std::string skip_reason;
  double ratio = 0;        // best grid ratio
  bool duo = false;        // best candidate used duo scaling
  double loss_rtn = 0;     // MSE of the inspected output with plain RTN (identity scales)
  double loss_best = 0;    // MSE with the chosen scales
  int64_t rejected = 0;    // candidates rejected (non-finite loss, overflow)
  int64_t stopped_early = 0;  // candidates dropped once their partial loss exceeded the best so far
  double scale_min = 0, scale_max = 0;  // of the chosen s
};

/// Relative output error ||X·Wᵀ − X·Q(W)ᵀ||² / ||X·Wᵀ||² of one linear on calibration inputs
/// (at most 8192 rows): RTN of the original weights vs the final AWQ weights on their inputs.
struct AwqLinearReport {
  std::string name;
  bool quantized = false;
  double rtn_error = 0;
  double awq_error = 0;
};

struct AwqLayerReport {
  int64_t layer = 0;
  std::vector<AwqMappingReport> mappings;
  std::vector<AwqLinearReport> linears;
  double seconds = 0;
};

/// Receives one decoder-layer tensor AWQ produced: its HF name (e.g.
/// "model.layers.0.input_layernorm.weight") and new fp32 values, row-major in the stored shape.
/// Called for every weight (and bias) of a layer, norms first then q/k/v/o/gate/up/down, as soon
/// as the layer's search and propagation are done; a non-OK status stops RunAwq and is returned.
using AwqTensorSink = std::function<Status(const std::string& name, std::vector<float> values)>;

struct AwqResult {
  std::vector<AwqLayerReport> layers;
  std::vector<std::string> messages;   // e.g. skipped mappings (GQA)
  std::vector<AwqMapping> used;        // mappings applied in at least one layer
  double seconds = 0;
};

/// Runs AWQ on every decoder layer of the dense checkpoint `store` (config `mc`) with calibration
/// tokens [batch, seq_len] (each row an independent sequence from position 0) and the Quark
/// config `cfg` (resolves each projection's spec; excluded projections are smoothed but stay in
/// float). Every layer's resulting tensors go to `sink` (see AwqTensorSink) and are not kept.
/// `progress(done, total)` counts (layer, mapping) steps.
/// Errors: seq_len > max_position_embeddings, a mapping naming an unknown module or one whose
/// prev_op does not feed its layers (names the mapping), a projection whose K is not a multiple
/// of its group size, missing/mis-shaped tensors, no finite candidate loss (names the layer).
Result<AwqResult> RunAwq(const ModelConfig& mc, const TensorStore& store, const QuarkQuantConfig& cfg,
                         const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len, const AwqSettings& settings,
                         const AwqTensorSink& sink, const std::function<void(int64_t, int64_t)>& progress);

}  // namespace nibble
