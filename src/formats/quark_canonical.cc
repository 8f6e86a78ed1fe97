// Canonical Quark configs (SPEC §1.3, §1.8).
#include "formats/quark_canonical.h"

#include <algorithm>

namespace nibble {

bool IsPlainLayerName(const std::string& entry) {
  return !entry.empty() && entry.find_first_of("*?[,") == std::string::npos && entry.rfind("re:", 0) != 0;
}

Result<QuarkQuantConfig> CanonicalQuarkConfig(const QuarkQuantConfig& c, const std::vector<std::string>& modules,
                                              const std::vector<std::string>& absent) {
  QuarkQuantConfig out = c;
  out.exclude.clear();
  out.layer_quant_config.clear();
  out.layer_type_quant_config.clear();
  if (auto it = c.layer_type_quant_config.find("Linear"); it != c.layer_type_quant_config.end()) out.global = it->second;
  for (const std::string& e : c.exclude)
    if (IsPlainLayerName(e) && std::find(out.exclude.begin(), out.exclude.end(), e) == out.exclude.end())
      out.exclude.push_back(e);
  auto exclude = [&](const std::string& m) {
    if (std::find(out.exclude.begin(), out.exclude.end(), m) == out.exclude.end()) out.exclude.push_back(m);
  };
  for (const std::string& m : modules) {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(c, m));
    if (r.rule.rfind("excluded by ", 0) == 0) {
      exclude(m);
    } else if (r.rule.rfind("layer_quant_config[", 0) == 0) {
      out.layer_quant_config.emplace_back(m, r.spec);
    }
  }
  for (const std::string& m : absent) {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(c, m));
    if (r.spec) exclude(m);
  }
  return out;
}

}  // namespace nibble
