// GPTQ settings and their Quark `algo_config` form (SPEC §3.1): damping, block size, when group
// parameters are fitted, act-order, true-sequential, propagation — parsed and validated once,
// here, into enums.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "quantize/pipeline.h"

namespace nibble {

/// When a group's scale and zero point are fitted.
enum class GptqScaleTiming {
  kUpFront,  // all groups from the original weights before the column loop (llm-compressor)
  kDynamic,  // refitted when the loop reaches the group's first column, from the updated weights
             // (GPTQModel / AutoGPTQ with static_groups false)
};

/// Column order of the loop (act-order quantizes the columns with the largest Hessian diagonal
/// first).
enum class GptqActOrder {
  kNone,    // natural order
  kStatic,  // descending diag(H), groups kept on the natural columns: g_idx stays natural
            // (llm-compressor "weight", GPTQModel desc_act + static_groups)
  kGroup,   // groups formed in the permuted order: g_idx is not monotonic (llm-compressor "group")
};

Result<GptqScaleTiming> ParseGptqScaleTiming(const std::string& text, const std::string& what);
Result<GptqActOrder> ParseGptqActOrder(const std::string& text, const std::string& what);
const char* GptqScaleTimingName(GptqScaleTiming t);  // "up_front" | "dynamic"
const char* GptqActOrderName(GptqActOrder a);        // "none" | "static" | "group"

struct GptqSettings {
  double dampening_frac = 0.01;  // of mean(diag(H)), added to the diagonal
  // After a failed Cholesky factorisation the fraction grows by this much and the factorisation
  // is retried while it stays below 1 (GPTQModel's damp_auto_increment).
  double damp_increment = 0.0015;
  int64_t block_size = 128;      // columns per lazy batch update
  GptqScaleTiming scale_timing = GptqScaleTiming::kUpFront;
  GptqActOrder actorder = GptqActOrder::kNone;
  // Hessians of o_proj, gate/up and down_proj from the layer with the linears before them
  // already quantized (GPTQModel); false takes every Hessian from one pass over the layer with
  // its float weights (llm-compressor).
  bool true_sequential = false;
  Propagation propagation = Propagation::kQuantized;
};

/// How errors name the settings a run validates: by the flag that gave each, or by the key of
/// the algo_config entry that overrode it (ApplyGptqAlgoConfig).
struct GptqSettingNames {
  std::string dampening_frac = "--dampening_frac";
  std::string block_size = "--block_size";
  std::string scale_timing = "--gptq_scale_timing";
  std::string actorder = "--actorder";
};

/// Checks ranges and combinations: once per run, on the settings as they run. Errors name the
/// settings as `names` does.
Status ValidateGptqSettings(const GptqSettings& s, const GptqSettingNames& names = {});

/// Applies the GPTQ entry of a Quark `algo_config` (`entry`, found by FindAlgoConfigEntry; `where`
/// names it in errors, "algo_config[i]") onto `s`, key by key: Quark's keys damp_percent, block_size, desc_act,
/// static_groups (desc_act with static_groups is act-order static, without it act-order group;
/// static_groups false is dynamic scale timing) and nibble's keys scale_timing, actorder,
/// true_sequential, propagation, which win over Quark's; `names` gets the key of each validated
/// setting it gave. Parses only
/// (ValidateGptqSettings checks the result). Errors name the key, the value and what is allowed.
Status ApplyGptqAlgoConfig(const nlohmann::ordered_json& entry, const std::string& where, GptqSettings& s,
                           GptqSettingNames& names);

/// The "gptq" algo_config entry written to config.json: Quark's keys (damp_percent, block_size,
/// desc_act, static_groups, true_sequential, model_decoder_layers) and nibble's (scale_timing,
/// actorder, propagation).
nlohmann::ordered_json GptqAlgoConfigEntry(const GptqSettings& s);

}  // namespace nibble
