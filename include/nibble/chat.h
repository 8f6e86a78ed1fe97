// Chat templates: a model's `chat_template` (tokenizer_config.json, a Jinja template) rendered for
// a conversation the way Transformers' apply_chat_template renders it, for `generate --chat`
// and any front end that holds conversations; the end-of-turn markers a template writes; and
// ChatTurns, which keeps a conversation's KV cache across turns.
//
// One turn of a front end (as `generate --chat` runs it):
//   ChatTurns turns(session, tmpl);  EndOfTurn eot = EndOfTurnFor(model, tmpl);
//   messages.push_back({"user", line});
//   auto p = turns.NextPrompt(messages);                  // the ids past the kept prefix
//   GenerateOptions g;  g.prompt_ids = p->ids;  g.stop_ids = eot.ids;  g.stop = eot.markers;
//   auto stats = Generate(session, g, [&](std::string_view piece) { reply += piece; return true; });
//   messages.push_back({"assistant", reply});
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nibble/error.h>
#include <nibble/model.h>
#include <nibble/session.h>

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

/// What ends an assistant turn of `tmpl`: the end-of-turn markers of the common chat formats
/// that the template writes (<|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>, <|endoftext|>), and
/// its eos_token when the template writes eos_token. The model's EOS ids end a turn as well
/// (Generate stops at them).
struct EndOfTurn {
  std::vector<std::string> markers;  // as text: GenerateOptions::stop
  std::vector<int32_t> ids;          // the markers that are one token of `model`'s vocabulary (special
                                     // added tokens): GenerateOptions::stop_ids, so generation stops
                                     // at the id whatever the detokenizer shows for it
};
EndOfTurn EndOfTurnFor(const Model& model, const ChatTemplate& tmpl);

/// KV-cache reuse across the turns of one conversation on one Session (llama-server's
/// cache_prompt for a chat). Each turn renders the whole conversation and tokenizes it; the
/// session keeps the longest common token prefix of the ids it holds and the render's
/// (Session::KeepCommonPrefix) and the rest is prefilled (Prompt::ids as prompt_ids), so the
/// context holds exactly the render's ids, as a fresh session prefilled with them would. A
/// template that writes earlier replies back verbatim keeps all but the ids where the reply's
/// text tokenizes otherwise than it was generated; one that trims or rewrites earlier turns
/// (or adds text to the open turn's header only, e.g. Qwen3's `<think>\n\n</think>\n\n`) cuts
/// back to the first id that differs. One BOS: a template's leading bos_token is dropped from the
/// text before tokenizing when the tokenizer prepends BOS itself.
///
/// No state besides the session's ids: the session may be used otherwise between turns (a
/// Fork, a PrefixCache restore). The Session must outlive this object.
class ChatTurns {
 public:
  explicit ChatTurns(Session& session, ChatTemplate tmpl, std::string extra_vars_json = "");

  struct Prompt {
    std::string rendered;          // the whole conversation as the template renders it
    std::vector<int32_t> ids;      // GenerateOptions::prompt_ids of this turn: the render's ids
                                   // past the kept prefix
    int64_t reused_positions = 0;  // session positions kept (the turn's GenerateStats::cached_tokens)
    bool cut = false;              // the session held ids past the common prefix: they were dropped
    size_t differs_at = 0;         // the first token position where the held ids and the render's
                                   // differ (when cut)
  };
  /// Renders `messages` (the whole conversation, last a user turn) with the generation prompt
  /// and the extra template variables, tokenizes it and keeps the session's common prefix.
  /// Errors: RenderChat's, the tokenizer's.
  Result<Prompt> NextPrompt(const std::vector<ChatMessage>& messages);
  /// The ids of a rendered conversation as NextPrompt runs them (one BOS).
  Result<std::vector<int32_t>> Tokenize(const std::string& rendered) const;

 private:
  Session* session_;
  ChatTemplate tmpl_;
  std::string extra_vars_json_;
};

}  // namespace nibble
