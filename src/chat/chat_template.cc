// Chat template loading (tokenizer_config.json) and rendering.
#include "chat/chat_template.h"

#include <chrono>

#include "chat/jinja_parser.h"
#include "io/json.h"

namespace nibble::chat {

namespace {

// A special token entry: "text" or {"content": "text", ...}; absent or null is "".
Result<std::string> TokenString(const nlohmann::json& cfg, const char* key, const std::string& path) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::string();
  const nlohmann::json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return MakeErrorCode(ErrorCode::kCorruptInput, path, ": ", key, ": expected a string or an object with a string \"content\", found ",
                       v.dump());
}

Error ToError(const JinjaError& e, const std::string& origin) {
  return MakeError(origin, ":", e.pos().line, ":", e.pos().col, ": ", e.what());
}

Value StrftimeNow(std::optional<std::time_t> now) {
  return Value::Function([now](const CallArgs& a, SourcePos pos) {
    if (a.positional.empty() || !a.positional[0].is_string()) throw JinjaError(pos, "strftime_now(format): format must be a string");
    const std::time_t t = now ? *now : std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[512];
    const std::string& fmt = a.positional[0].str();
    if (fmt.size() > 128) throw JinjaError(pos, "strftime_now: format longer than 128 bytes");
    const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return Value::String(std::string(buf, n));
  });
}

}  // namespace

Result<ChatTemplateSource> LoadChatTemplateConfig(const std::string& path, bool require_template) {
  NIBBLE_ASSIGN_OR_RETURN(const nlohmann::json cfg, ReadJsonFile(path));
  if (!cfg.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, path, ": expected a JSON object");
  ChatTemplateSource out;
  out.origin = path;
  NIBBLE_ASSIGN_OR_RETURN(out.bos_token, TokenString(cfg, "bos_token", path));
  NIBBLE_ASSIGN_OR_RETURN(out.eos_token, TokenString(cfg, "eos_token", path));
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) {
    if (!require_template) return out;
    return MakeErrorCode(ErrorCode::kNotFound, path, ": no \"chat_template\" (give one with --chat_template FILE)");
  }
  const nlohmann::json& t = cfg["chat_template"];
  if (t.is_string()) {
    out.source = t.get<std::string>();
    return out;
  }
  if (!t.is_array())
    return MakeErrorCode(ErrorCode::kCorruptInput, path, ": chat_template: expected a string or a list of {name, template}, found ",
                         t.type_name());
  std::string names;
  for (size_t i = 0; i < t.size(); ++i) {
    const nlohmann::json& e = t[i];
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") || !e["template"].is_string())
      return MakeErrorCode(ErrorCode::kCorruptInput, path, ": chat_template[", i, "]: expected {\"name\": string, \"template\": string}");
    if (e["name"] == "default") {
      out.source = e["template"].get<std::string>();
      return out;
    }
    names += (names.empty() ? "" : ", ") + e["name"].get<std::string>();
  }
  return MakeErrorCode(ErrorCode::kNotFound, path, ": chat_template: no template named \"default\" (found: ", names, ")");
}

Status CheckChatTemplate(std::string_view source, const std::string& origin) {
  try {
    (void)Parse(source);
  } catch (const JinjaError& e) {
    return ToError(e, origin);
  }
  return Status::Ok();
}

Result<std::string> RenderChat(const ChatTemplateSource& tmpl, const nlohmann::ordered_json& messages,
                               const ChatRenderOptions& options) {
  if (!messages.is_array()) return MakeError(tmpl.origin, ": messages must be a JSON array");
  if (!options.extra_vars.is_object()) return MakeError(tmpl.origin, ": extra template variables must be a JSON object");
  try {
    const Body body = Parse(tmpl.source);
    ValueDict globals = {{"messages", Value::FromJson(messages)},
                         {"add_generation_prompt", Value::Bool(options.add_generation_prompt)},
                         {"bos_token", Value::String(tmpl.bos_token)},
                         {"eos_token", Value::String(tmpl.eos_token)},
                         {"strftime_now", StrftimeNow(options.now)}};
    for (auto it = options.extra_vars.begin(); it != options.extra_vars.end(); ++it) {
      bool replaced = false;
      for (auto& kv : globals)
        if (kv.first == it.key()) kv.second = Value::FromJson(it.value()), replaced = true;
      if (!replaced) globals.emplace_back(it.key(), Value::FromJson(it.value()));
    }
    return RenderTemplate(body, globals, options.limits);
  } catch (const JinjaError& e) {
    return ToError(e, tmpl.origin);
  }
}

}  // namespace nibble::chat
