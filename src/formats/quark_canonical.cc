// Canonical Quark configs (SPEC §1.3, §1.8).
#include "formats/quark_canonical.h"

#include <algorithm>

namespace nibble {

bool IsPlainLayerName(const std::string& entry) {
  return !entry.empty() && entry.find_first_of("*?[,") == std::string::npos && entry.rfind("re:", 0) != 0;
}

namespace {

// The spec most quantized modules resolve to (ties: `current` if it is among them, else the first
// in module order), so that the fewest modules need a key of their own.
std::optional<WeightQuantSpec> CommonSpec(const std::vector<std::optional<WeightQuantSpec>>& specs,
                                          const std::optional<WeightQuantSpec>& current) {
  std::vector<std::pair<WeightQuantSpec, int64_t>> counts;
  for (const auto& s : specs) {
    if (!s) continue;
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == *s; });
    if (it == counts.end()) counts.emplace_back(*s, 1);
    else ++it->second;
  }
  if (counts.empty()) return current;
  auto best = counts.begin();
  for (auto it = counts.begin(); it != counts.end(); ++it)
    if (it->second > best->second || (it->second == best->second && current && it->first == *current)) best = it;
  return best->first;
}

}  // namespace

Result<QuarkQuantConfig> CanonicalQuarkConfig(const QuarkQuantConfig& c, const std::vector<std::string>& modules,
                                              const std::vector<std::string>& absent) {
  std::vector<std::optional<WeightQuantSpec>> specs;
  for (const std::string& m : modules) {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(c, m));
    specs.push_back(r.spec);
  }
  QuarkQuantConfig out = c;
  out.exclude.clear();
  out.layer_quant_config.clear();
  out.layer_type_quant_config.clear();
  out.global = CommonSpec(specs, c.global);
  auto exclude = [&](const std::string& m) {
    if (std::find(out.exclude.begin(), out.exclude.end(), m) == out.exclude.end()) out.exclude.push_back(m);
  };
  for (const std::string& e : c.exclude)
    if (IsPlainLayerName(e)) exclude(e);
  for (size_t i = 0; i < modules.size(); ++i) {
    if (!specs[i]) exclude(modules[i]);
    else if (specs[i] != out.global) out.layer_quant_config.emplace_back(modules[i], specs[i]);
  }
  for (const std::string& m : absent) {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(out, m));
    if (r.spec) exclude(m);
  }
  return out;
}

}  // namespace nibble
