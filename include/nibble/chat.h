// Chat templates: a model's `chat_template` (tokenizer_config.json, a Jinja template) rendered for
// a conversation the way Transformers' apply_chat_template renders it, for `generate --chat`
// and any front end that holds conversations.
#pragma once

#include <string>
#include <vector>

#include <nibble/error.h>

namespace nibble {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" (the template decides what it accepts)
  std::string content;
};

/// A template and the special-token strings it is rendered with.
struct ChatTemplate {
  std::string source;     // Jinja text
  std::string bos_token;  // tokenizer_config.json's bos_token ("" when none)
  std::string eos_token;
  std::string origin;     // the file it came from (errors name it)
};

/// The chat template of the model in `dir` (its tokenizer_config.json), or the Jinja text of
/// `template_file` when that is not empty (bos / eos tokens still from tokenizer_config.json when
/// the directory has one). Errors: no chat_template (kNotFound, says to pass a file), malformed
/// tokenizer_config.json (names the key), unreadable file, a template that does not parse
/// (names line:col and what it met).
Result<ChatTemplate> LoadChatTemplate(const std::string& dir, const std::string& template_file = "");

/// Checks extra template variables as RenderChat takes them: "" (none) or a JSON object text.
/// Model-free, so a front end checks them before loading anything. Errors quote the text.
Status ValidateChatTemplateVars(const std::string& extra_vars_json);

/// Renders `messages` with `add_generation_prompt` (the assistant header after the last turn)
/// and any extra template variables as a JSON object text (e.g. {"enable_thinking": false}).
/// `strftime_now` uses the current time. Errors name origin, line:col and what the template met
/// (an unknown filter, a raise_exception message, ...).
Result<std::string> RenderChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt, const std::string& extra_vars_json = "");

}  // namespace nibble
