// Chat templates: a model's `chat_template` (tokenizer_config.json, a Jinja template) rendered for
// a conversation the way Transformers' apply_chat_template renders it, for `generate --chat`
// and any front end that holds conversations; the end-of-turn markers a template writes; and
// ChatTurns, which keeps a conversation's KV cache across turns.
//
// One turn of a front end (as `generate --chat` runs it):
//   ChatTurns turns(session, tmpl);  EndOfTurn eot = EndOfTurnFor(model, tmpl);
//   messages.push_back({"user", line});
//   auto p = turns.NextPrompt(messages);                  // only the new suffix
//   GenerateOptions g;  g.prompt = p->text;  g.stop_ids = eot.ids;  g.stop = eot.markers;
//   auto stats = Generate(session, g, [&](std::string_view piece) { reply += piece; return true; });
//   turns.AddReply(*stats, reply, stats->stop_string);
//   messages.push_back({"assistant", reply});
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
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
/// cache_prompt for a chat). Each turn renders the whole conversation; NextPrompt returns only
/// the text beyond what the session already holds. The template normally writes earlier replies
/// back verbatim, so the render starts with the cached text; when it does not (a template that
/// trims or rewrites earlier turns), the session is cut back to the last point where text and
/// positions are known to agree (the start, the end of every turn's prompt and of that prompt
/// without its generation prompt, e.g. Qwen3's `<think>\n\n</think>\n\n`, the end of every
/// reply that ended at EOS or an end-of-turn id) and that point on is prefilled again. On an
/// empty session a template's leading bos_token is dropped from the text when the tokenizer
/// prepends BOS itself, so the prompt holds one BOS, not two.
///
/// The session and this object go together: between NextPrompt and AddReply run exactly one
/// Generate on the session with the returned text as its prompt, and change the session
/// otherwise only through this object. The Session must outlive it.
class ChatTurns {
 public:
  explicit ChatTurns(Session& session, ChatTemplate tmpl, std::string extra_vars_json = "");

  struct Prompt {
    std::string text;              // GenerateOptions::prompt of this turn
    int64_t reused_positions = 0;  // session positions kept from earlier turns (the turn's
                                   // GenerateStats::cached_tokens)
    bool cut = false;              // the render differed from the cached text: the session was cut back
    size_t differs_at = 0;         // the first byte where it differed (when cut)
  };
  /// Renders `messages` (the whole conversation, last a user turn) with the generation prompt
  /// and the extra template variables; cuts the session back when needed. Errors: RenderChat's.
  Result<Prompt> NextPrompt(const std::vector<ChatMessage>& messages);
  /// Records the reply Generate gave for the last NextPrompt: `reply` the text shown (without
  /// the end-of-turn marker), `end_marker` the stop string that ended it ("" when none did:
  /// GenerateStats::stop_string).
  void AddReply(const GenerateStats& stats, const std::string& reply, const std::string& end_marker);

 private:
  struct Mark {
    int64_t position;
    size_t text_len;
  };
  Session* session_;
  ChatTemplate tmpl_;
  std::string extra_vars_json_;
  std::string fed_;                   // the text whose tokens the session holds (plus `unfed_`)
  std::vector<Mark> marks_ = {{0, 0}};  // points where text and positions agree
  int64_t unfed_ = 0;                 // a reply cut by -n leaves its last token for the next Generate
  int64_t reused_ = 0;
  std::optional<Mark> pending_mark_;  // this turn's prompt without the generation prompt
};

}  // namespace nibble
