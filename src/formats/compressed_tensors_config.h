// The compressed-tensors `quantization_config` (llm-compressor's checkpoints, SPEC §2.2) restricted
// to what nibble runs: `pack-quantized` int4 weights, group or channel strategy, no activation,
// KV-cache, sparsity or transform quantization. Everything else is refused when the config is
// parsed, naming the key, before any tensor is read.
//
// Resolution of a module name (SPEC §2.2 "Target/ignore matching", §9.2), as the compressed-tensors
// library and vLLM read it for an unfused module:
// * `ignore` wins: an entry equal to the name, a `re:` regex that re.match-es it (anchored at the
//   start only), or a class name of the module ("Linear", "Module": every linear);
// * else the config groups' targets, flattened in group order (a target repeated in a later group
//   keeps its first position and takes the later group, as a Python dict does): the first target
//   equal to the name or whose `re:` regex matches it; failing that, the first class-name target;
// * else the module stays in float.
// `re:` patterns are RE2 regexes (formats/fnmatch.h MatchesExcludeEntry): linear-time matching of
// the Python `re` subset configs use; a pattern RE2 cannot compile (lookaround, backreferences) is
// refused at parse naming its key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "formats/quant_spec.h"

namespace nibble {

/// QuantizationArgs `actorder`: null, "group" (aliases "dynamic": a weight_g_idx per module) or
/// "weight" ("static": columns already in natural groups, no g_idx).
enum class CtActOrder { kNone, kGroup, kWeight };

/// The weights' QuantizationArgs of one config group, as far as nibble reads them.
struct CtWeightArgs {
  bool symmetric = true;  // the library's default
  Granularity granularity = Granularity::kPerGroup;
  int64_t group_size = 128;  // > 0 for group; −1 for channel
  CtActOrder actorder = CtActOrder::kNone;
  bool operator==(const CtWeightArgs&) const = default;
};

struct CtGroup {
  std::string name;                     // "group_0"
  std::vector<std::string> targets;     // names, `re:` regexes, class names
  std::optional<CtWeightArgs> weights;  // nullopt: `weights` null (the group quantizes nothing)
};

struct CtConfig {
  std::vector<CtGroup> groups;  // in JSON order
  /// The flattened targets: (target, index into groups), first occurrence order, last group wins.
  std::vector<std::pair<std::string, size_t>> targets;
  std::vector<std::string> ignore;
  nlohmann::ordered_json json;  // the quantization_config as read
};

/// Parses a `quantization_config` object whose quant_method is "compressed-tensors". `where`
/// prefixes every error ("DIR/config.json: quantization_config"). Refused, naming the key:
/// a format other than pack-quantized (top level or per group; "mixed-precision" at the top level
/// when every group names its own), quantization_status other than "compressed", kv_cache_scheme,
/// a sparsity_config that is not empty or "dense", a non-empty transform_config, no config
/// groups, input / output activation quantization, num_bits ≠ 4, type ≠ "int", strategies other
/// than group / channel, block_structure, dynamic weights, an invalid actorder, a `re:` pattern
/// RE2 cannot compile, and any value of the wrong JSON type.
Result<CtConfig> ParseCtConfig(const nlohmann::ordered_json& qc, const std::string& where);

/// The neutral spec of a group's weights (scale dtype: the stored one).
QuantSpec CtSpecFor(const CtWeightArgs& args);

/// Whether `entry` (a target or ignore entry) matches module `name`: exact name, `re:` regex
/// (re.match), or a class name every linear has ("Linear", "Module"). `class_names` false tests
/// names and regexes only. Errors: a regex RE2 cannot compile.
Result<bool> CtEntryMatches(const std::string& name, const std::string& entry, bool class_names = true);
/// Whether `entry` is a class name that matches every linear ("Linear", "Module").
bool IsCtLinearClass(const std::string& entry);

/// The decision for one module: the group (index into c.groups, or −1) and the rule for messages
/// (`ignore "lm_head"`, `config_groups.group_0.targets "Linear"`, `no config group targets it`).
struct CtResolved {
  std::optional<QuantSpec> spec;
  int64_t group = -1;
  std::string rule;
};
Result<CtResolved> ResolveCt(const CtConfig& c, const std::string& module);

/// One warning per ignore entry and target that matches none of `modules` (ignore entries that
/// match lm_head, llm-compressor's default among them, are never warned about: a tied model
/// stores none), and per config group none of whose targets decides a module.
Result<std::vector<std::string>> CtUnusedEntries(const CtConfig& c, const std::vector<std::string>& modules);

/// The QuantizationArgs object written for `spec` (SPEC §2.2 keys): num_bits 4, type "int",
/// symmetric, group_size (null for channel), strategy, block_structure null, dynamic false,
/// actorder ("group" when `g_idx`, else null), observer "minmax", observer_kwargs {}.
nlohmann::ordered_json CtWeightArgsJson(const QuantSpec& spec, bool g_idx);

}  // namespace nibble
