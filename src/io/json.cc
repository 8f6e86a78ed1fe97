#include "io/json.h"

#include <set>
#include <vector>

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
    return MakeErrorCode(ErrorCode::kCorruptInput, what, ": not valid JSON (", e.what(), ")");
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

}  // namespace nibble
