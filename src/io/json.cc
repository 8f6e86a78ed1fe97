#include "io/json.h"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "base/strings.h"
#include "io/file.h"

namespace nibble {

using nlohmann::json;

namespace {
// Thrown from the parse callback to stop at the first too-deep value.
struct JsonTooDeep {};
}  // namespace

Result<json> ParseJsonText(const std::string& text, const std::string& what) {
  std::vector<std::set<std::string>> keys_per_depth;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    // Untrusted files (a safetensors header may be 100 MB) could otherwise nest millions of
    // levels deep and cost gigabytes of DOM and per-depth key sets.
    if (depth > kMaxJsonDepth) throw JsonTooDeep{};
    size_t d = static_cast<size_t>(depth);
    if (keys_per_depth.size() <= d) keys_per_depth.resize(d + 1);
    if (event == json::parse_event_t::object_start) {
      if (keys_per_depth.size() <= d + 1) keys_per_depth.resize(d + 2);
      keys_per_depth[d + 1].clear();
    } else if (event == json::parse_event_t::key) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys_per_depth[d].insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, what, ": not valid JSON (", PrintableBytes(e.what()), ")");
  } catch (const JsonTooDeep&) {
    return MakeErrorCode(ErrorCode::kCorruptInput, what, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
  }
  if (!duplicate.empty()) return MakeErrorCode(ErrorCode::kCorruptInput, what, ": duplicate key \"", duplicate, "\"");
  return j;
}

Result<json> ReadJsonFile(const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseJsonText(text, path);
}

nlohmann::ordered_json DoubleJson(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double DoubleFromJson(const nlohmann::ordered_json& j) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return j.get<double>();
}

}  // namespace nibble
