// Chat templates: tokenizer_config.json's `chat_template` (a Jinja template) rendered for a list
// of messages as Transformers' apply_chat_template renders it: variables `messages`,
// `add_generation_prompt`, `bos_token`, `eos_token`, any extra ones the caller passes, and the
// functions `raise_exception(msg)` and `strftime_now(format)` (a caller-given time, so renders
// are reproducible).
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "chat/jinja_interpreter.h"

namespace nibble::chat {

/// A template and the special-token strings it is rendered with.
struct ChatTemplateSource {
  std::string source;     // Jinja text
  std::string bos_token;  // "" when tokenizer_config.json has none
  std::string eos_token;
  std::string origin;     // where it came from, for errors: "<dir>/tokenizer_config.json" or a file
};

/// Reads `chat_template`, `bos_token` and `eos_token` from a tokenizer_config.json (the token
/// entries may be strings or {"content": ...} objects; `chat_template` a string or a list of
/// {"name", "template"} of which "default" is taken). Errors name the file and key; a missing
/// chat_template is kNotFound unless `require_template` is false (then the source is "": the
/// caller brings its own template and wants the token strings only).
Result<ChatTemplateSource> LoadChatTemplateConfig(const std::string& tokenizer_config_path, bool require_template = true);

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json extra_vars = nlohmann::ordered_json::object();  // more template variables
  std::optional<std::time_t> now;  // strftime_now's time (UTC); unset: the current time
  RenderLimits limits;
};

/// Renders `tmpl` for `messages` (a JSON array of {"role", "content", ...} objects). Errors
/// (kInvalidArgument) name the origin, line:col and what was met: a syntax error, an unknown
/// filter or test, a raise_exception message, a limit reached.
Result<std::string> RenderChat(const ChatTemplateSource& tmpl, const nlohmann::ordered_json& messages,
                               const ChatRenderOptions& options);

/// Parses `source` only (no render): the same errors as RenderChat's syntax errors.
Status CheckChatTemplate(std::string_view source, const std::string& origin);

}  // namespace nibble::chat
