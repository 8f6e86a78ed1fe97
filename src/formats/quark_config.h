// The AMD Quark `quantization_config` model (custom_mode "quark", hf_format) and its per-layer
// resolution, restricted to what nibble supports: weight-only 4-bit (W4A16 in Quark's terms;
// activations stay in the model's float dtype).
//
// Goals: parse every form Quark's own loader accepts (legacy null maps, algo_config as an object,
// absent version / quant_mode), refuse everything we cannot run with an error that names the JSON
// key, expected and found; write back the full Quark schema (SPEC §1.2) such that
// Parse(ToJson(c)) == c; resolve a layer name with Quark's semantics (SPEC §1.3).
// Non-goals: activation / output / bias / KV-cache / softmax quantization, multi-stage specs,
// non-4-bit dtypes. Those are rejected, never silently ignored.
//
// Key order matters: `layer_quant_config` is searched in the order of the JSON text, so parsing
// uses nlohmann::ordered_json (nlohmann::json sorts keys). Note that HF `save_pretrained` writes
// config.json with sorted keys, so in files written by transformers "JSON order" is alphabetical.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "io/safetensors.h"

namespace nibble {

/// Quark `dtype` of a weight spec (SPEC §1.2): "int4" = signed codes −8..7 (symmetric),
/// "uint4" = unsigned codes 0..15 with zero points (asymmetric).
enum class QuantDType { kInt4, kUint4 };

/// Quark `qscheme` (SPEC §1.2, §1.4): "per_group" (groups of `group_size` along K, tensors stored
/// transposed) or "per_channel" (one scale per output row, not transposed).
enum class QScheme { kPerGroup, kPerChannel };

/// Nibble order inside each int32 word (SPEC §1.5): kReorder = AWQ order map [0,2,4,6,1,3,5,7]
/// (Quark's default), kOrder = sequential [0..7].
enum class PackMethod { kReorder, kOrder };

/// `export.weight_format` (SPEC §1.1, §1.4): real_quantized = packed int32 codes;
/// fake_quantized = the QDQ'd float weight is stored under `P.weight`.
enum class WeightFormat { kRealQuantized, kFakeQuantized };

/// JSON names ("int4", "per_group", "reorder", "real_quantized", ...).
const char* QuantDTypeName(QuantDType d);
const char* QSchemeName(QScheme q);
const char* PackMethodName(PackMethod p);
const char* WeightFormatName(WeightFormat f);

/// A Quark QuantizationSpec for the `weight` of a linear, restricted to 4-bit (SPEC §1.2).
/// Invariants enforced by the parser: (dtype, symmetric) is (kInt4, true) or (kUint4, false);
/// per_group: group_size > 0 or −1, ch_axis == 1; per_channel: group_size == −1, ch_axis == 0.
struct WeightQuantSpec {
  QuantDType dtype = QuantDType::kUint4;
  bool is_dynamic = false;                     // must be false (static weights)
  QScheme qscheme = QScheme::kPerGroup;
  int64_t ch_axis = 1;                         // 1 for per_group, 0 for per_channel (Quark)
  int64_t group_size = 128;                    // g along K; −1 = one group per row (g = K)
  bool symmetric = false;
  std::string round_method = "half_even";      // "half_even" | "round" | "floor" (enum names)
  std::string scale_type = "float";            // "float" (model dtype) | "float32" | "float16" | "bfloat16"
  // Newer Quark keys (absent in older exports; null for int4 specs). Kept for round trips.
  std::optional<std::string> scale_format;
  std::optional<std::string> scale_calculation_mode;
  std::optional<std::string> mx_element_dtype;
  std::optional<std::string> observer_cls = "PerGroupMinMaxObserver";
  bool is_scale_quant = false;

  /// Group size along K for a row of length `k`: k when group_size == −1.
  int64_t EffectiveGroupSize(int64_t k) const { return group_size == -1 ? k : group_size; }

  bool operator==(const WeightQuantSpec&) const = default;
};

/// `export` object (Quark JsonExporterConfig, SPEC §1.2). Defaults = the dataclass defaults.
struct QuarkExportConfig {
  PackMethod pack_method = PackMethod::kReorder;
  WeightFormat weight_format = WeightFormat::kRealQuantized;
  std::vector<std::string> kv_cache_group;                                // [] unless KV quantized
  double min_kv_scale = 0.0;
  std::optional<std::vector<std::vector<std::string>>> weight_merge_groups;  // null by default

  bool operator==(const QuarkExportConfig&) const = default;
};

/// A whole Quark `quantization_config` (SPEC §1.2). A nullopt spec means "not quantized" (the
/// QuantizationConfig's `weight` is null, or the config object itself is null).
struct QuarkQuantConfig {
  std::optional<WeightQuantSpec> global;
  /// pattern → spec, in JSON order (first fnmatch wins).
  std::vector<std::pair<std::string, std::optional<WeightQuantSpec>>> layer_quant_config;
  /// class name → spec; only "Linear" is consulted by ResolveLayer.
  std::map<std::string, std::optional<WeightQuantSpec>> layer_type_quant_config;
  std::vector<std::string> exclude;  // fnmatch patterns or "re:<regex>"
  QuarkExportConfig export_config;   // JSON key "export"
  nlohmann::ordered_json algo_config;  // raw: null or a list (a legacy single object is wrapped)
  /// nibble's record of the calibration run (dataset name and sha256, num_calib_data, seq_len,
  /// seed, propagation), a sibling of algo_config; null (key absent) for RTN. Loaders ignore it.
  nlohmann::ordered_json calibration;
  std::string quant_mode = "eager_mode";
  std::optional<std::string> version;  // absent for quark <= 0.8

  bool operator==(const QuarkQuantConfig&) const = default;
};

/// Parses a Quark `quantization_config` object. `where` prefixes every error (e.g.
/// "models/x/config.json: quantization_config"). Errors name the JSON key path, expected and
/// found, e.g. `global_quant_config.weight.dtype: unsupported dtype "int3" (expected "int4" or
/// "uint4")`. Rejected: quant_method != "quark"; missing `export`; export.pack_method not
/// order/reorder; export.weight_format not real_quantized/fake_quantized; weight dtype other than
/// int4/uint4; (dtype, symmetric) not (int4, true) / (uint4, false); qscheme other than
/// per_group/per_channel; group_size missing/null (per_group), 0, < −1, or not an integer;
/// ch_axis other than 1 (per_group) / 0 (per_channel); is_dynamic true; input_tensors non-null
/// ("not W4A16, unsupported"); output_tensors / bias non-null; list-valued (multi-stage) specs;
/// non-empty kv_cache_quant_config; non-null softmax_quant_spec; invalid `re:` exclude entries;
/// any value of the wrong JSON type. Accepted legacy forms: null layer_quant_config /
/// layer_type_quant_config / kv_cache_quant_config / exclude, algo_config as a single object,
/// missing quant_mode / version / target_device and the newer spec keys. SPEC §1.2, §1.6.
Result<QuarkQuantConfig> ParseQuarkQuantConfig(const nlohmann::ordered_json& j, const std::string& where);
/// Deleted on purpose: nlohmann::json has lost the key order of layer_quant_config. Parse the
/// text with ParseQuarkQuantConfigFromConfigJson (or nlohmann::ordered_json) instead.
Result<QuarkQuantConfig> ParseQuarkQuantConfig(const nlohmann::json& j, const std::string& where) = delete;

/// For a config written by hand (`quantize --quant_config`): every key of the top level, `export`,
/// the QuantizationConfig objects and their weight specs must be one Quark writes (SPEC §1.2;
/// Quark's optional pre_quant_opt_config, log_severity_level and custom_mode are accepted too), so
/// a misspelt key is not silently ignored. Errors name the key path and the closest known key.
/// algo_config entries are checked by their algorithm.
Status CheckQuarkConfigKeys(const nlohmann::ordered_json& j, const std::string& where);

/// Parses a whole HF config.json text (`where` = its path) preserving key order, and parses its
/// "quantization_config" object. Errors: invalid JSON, duplicate keys, no quantization_config,
/// plus every ParseQuarkQuantConfig error (prefixed "<where>: quantization_config").
Result<QuarkQuantConfig> ParseQuarkQuantConfigFromConfigJson(const std::string& text, const std::string& where);

/// Writes the full Quark schema of SPEC §1.2 (the newer QuantizationSpec key set: dtype,
/// is_dynamic, qscheme, ch_axis, group_size, symmetric, round_method, scale_type, scale_format,
/// scale_calculation_mode, mx_element_dtype, observer_cls, is_scale_quant — current Quark's
/// to_dict; older loaders ignore unknown keys). Unquantized configs are written as
/// QuantizationConfig objects whose `weight` is null. Per-channel specs write group_size null.
/// Guarantees ParseQuarkQuantConfig(ToJson(c)) == c for any c that Parse accepts.
nlohmann::ordered_json ToJson(const QuarkQuantConfig& c);

/// The weight spec chosen for one layer and the rule that chose it, for messages and `inspect`.
struct ResolvedLayerConfig {
  std::optional<WeightQuantSpec> spec;  // nullopt: keep the layer in float
  /// e.g. `layer_quant_config["*down_proj"]`, `layer_type_quant_config["Linear"]`,
  /// `global_quant_config`, `excluded by "lm_head"`.
  std::string rule;
};

/// The patterns of one layer_quant_config key. vLLM accepts a key listing several layer names
/// separated by commas, so a key is split at ',' (blanks around each part dropped; empty parts
/// dropped) and each part is an fnmatch pattern matched against the whole name.
std::vector<std::string> LayerKeyPatterns(const std::string& key);
/// Whether `layer_name` fnmatches one of the key's patterns.
bool LayerKeyMatches(const std::string& layer_name, const std::string& key);

/// Sets every weight spec's scale_type (global, per layer, per type) to `dt`'s name
/// ("float32", "float16", "bfloat16"; F32, F16 or BF16 only).
void SetScaleDType(QuarkQuantConfig& c, DType dt);

/// Entries of `c` that decide no layer of a model whose linear modules are `modules`, one
/// warning each: an exclude entry that matches no layer (entries matching lm_head are not
/// reported: a tied model lists none), a layer_quant_config key (or one comma-separated part of
/// it) that matches no layer ("layer_quant_config pattern \"x\" matched no layer"), a key whose
/// layers are all excluded (exclude wins) or all decided by earlier keys, a
/// layer_type_quant_config type other than "Linear" (the only class nibble's layers have).
/// Errors: as ResolveLayer.
Result<std::vector<std::string>> UnusedConfigEntries(const QuarkQuantConfig& c, const std::vector<std::string>& modules);

/// Resolves the weight spec of the nn.Linear named `layer_name` (HF module name, e.g.
/// "model.layers.0.mlp.down_proj") with Quark semantics (SPEC §1.3, TV-6): `exclude` always wins
/// (fnmatch or `re:`); else the first `layer_quant_config` key (JSON order) that matches
/// (LayerKeyMatches);
/// else layer_type_quant_config["Linear"]; else global_quant_config.
/// Errors: an invalid `re:` exclude entry (names the entry and the layer).
Result<ResolvedLayerConfig> ResolveLayer(const QuarkQuantConfig& c, const std::string& layer_name);

}  // namespace nibble
