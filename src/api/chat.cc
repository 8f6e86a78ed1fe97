// Public API: chat templates over the chat layer.
#include <nibble/chat.h>

#include <filesystem>

#include "chat/chat_template.h"
#include "io/file.h"

namespace nibble {

Result<ChatTemplate> LoadChatTemplate(const std::string& dir, const std::string& template_file) {
  const std::string cfg_path = dir + "/tokenizer_config.json";
  const bool has_cfg = std::filesystem::exists(cfg_path);
  ChatTemplate out;
  if (has_cfg) {
    NIBBLE_ASSIGN_OR_RETURN(chat::ChatTemplateSource cfg, chat::LoadChatTemplateConfig(cfg_path, template_file.empty()));
    out = ChatTemplate{cfg.source, cfg.bos_token, cfg.eos_token, cfg.origin};
  }
  if (template_file.empty()) {
    if (!has_cfg)
      return MakeErrorCode(ErrorCode::kNotFound, dir, ": no tokenizer_config.json, so no chat template (give one with --chat_template FILE)");
  } else {
    NIBBLE_ASSIGN_OR_RETURN(out.source, ReadFileToString(template_file));
    out.origin = template_file;
  }
  NIBBLE_RETURN_IF_ERROR(chat::CheckChatTemplate(out.source, out.origin));
  return out;
}

namespace {

Result<nlohmann::ordered_json> ParseTemplateVars(const std::string& text) {
  if (text.empty()) return nlohmann::ordered_json::object();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return MakeError("extra chat template variables: expected a JSON object such as {\"enable_thinking\": false}, found: ",
                     text);
  return j;
}

}  // namespace

Status ValidateChatTemplateVars(const std::string& extra_vars_json) {
  auto parsed = ParseTemplateVars(extra_vars_json);
  if (!parsed.ok()) return parsed.error();
  return Status::Ok();
}

Result<std::string> RenderChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt, const std::string& extra_vars_json) {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  chat::ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  NIBBLE_ASSIGN_OR_RETURN(o.extra_vars, ParseTemplateVars(extra_vars_json));
  return chat::RenderChat(chat::ChatTemplateSource{tmpl.source, tmpl.bos_token, tmpl.eos_token, tmpl.origin}, msgs, o);
}

}  // namespace nibble
