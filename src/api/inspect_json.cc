// The JSON forms of a checkpoint's inspection and size (`nibble inspect --json`, the `size`
// object of quantize / compare --json, the Python binding's inspect()): one place for their keys.
#include <nlohmann/json.hpp>

#include <nibble/quantize.h>

namespace nibble {

namespace {

nlohmann::ordered_json SizeValue(const SizeSummary& s) {
  return {{"bits_per_weight", s.bits_per_weight()},
          {"quantized_linears", s.quantized_linears},
          {"quantized_weights", s.quantized_weights},
          {"quantized_bytes", s.quantized_bytes},
          {"tensor_bytes", s.tensor_bytes},
          {"float_tensor_bytes", s.float_tensor_bytes},
          {"float_bits", s.float_bits}};
}

double BitsPerWeight(const InspectReport::Layer& l) {
  SizeSummary one;
  one.quantized_weights = l.n * l.k;
  one.quantized_bytes = l.stored_bytes;
  return one.bits_per_weight();
}

nlohmann::ordered_json EnginesValue(const InspectReport& rep) {
  nlohmann::ordered_json j;
  j["engines"] = rep.engines;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& r : rep.engine_rows) {
    nlohmann::ordered_json per = nlohmann::ordered_json::object();
    for (size_t e = 0; e < r.readings.size(); ++e) per[rep.engines[e]] = {{"reads", r.readings[e]}, {"agrees", r.agrees[e]}};
    rows.push_back({{"name", r.name}, {"means", r.meant}, {"engines", per}});
  }
  j["linears"] = rows;
  j["disagreements"] = rep.engine_disagreements;
  nlohmann::ordered_json tp = nlohmann::ordered_json::array();
  for (const auto& t : rep.tensor_parallel) tp.push_back({{"tp", t.tp}, {"ok", t.ok}, {"failure", t.failure}});
  j["tensor_parallel"] = tp;
  return j;
}

}  // namespace

std::string SizeSummaryJson(const SizeSummary& size) { return SizeValue(size).dump(); }

std::string InspectJson(const InspectReport& rep, bool engines) {
  nlohmann::ordered_json j;
  j["dir"] = rep.dir;
  j["format"] = rep.format;
  j["torch_dtype"] = rep.torch_dtype;
  for (const auto& [key, value] : rep.format_properties) j[key] = value;
  j["total_tensor_bytes"] = rep.total_tensor_bytes;
  j["size"] = SizeValue(rep.size);
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : rep.layers)
    layers.push_back({{"name", l.name}, {"quantized", l.quantized}, {"scheme", l.scheme}, {"rule", l.rule},
                      {"out_features", l.n}, {"in_features", l.k}, {"stored_bytes", l.stored_bytes},
                      {"float_bytes", l.float_bytes}, {"bits_per_weight", BitsPerWeight(l)}});
  j["layers"] = layers;
  if (!rep.quantization_config_json.empty())
    j["quantization_config"] = nlohmann::ordered_json::parse(rep.quantization_config_json);
  if (engines) j["engines"] = EnginesValue(rep);
  j["warnings"] = rep.warnings;
  return j.dump(2);
}

}  // namespace nibble
