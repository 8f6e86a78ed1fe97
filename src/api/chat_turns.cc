// Public API: end-of-turn markers and ChatTurns, the KV reuse of a conversation across turns.
//
// KV reuse is token-level, as llama-server's for a chat: every turn tokenizes the whole render
// and Session::KeepCommonPrefix keeps the longest common prefix of those ids and the session's.
// No text bookkeeping: what the session holds is its ids, whatever ran (a reply, a reply cut by
// -n whose last token never ran, a Fork).
#include <algorithm>

#include <nibble/chat.h>

#include "api/model_impl.h"

namespace nibble {

EndOfTurn EndOfTurnFor(const Model& model, const ChatTemplate& t) {
  EndOfTurn out;
  for (const char* m : {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|endoftext|>"})
    if (t.source.find(m) != std::string::npos) out.markers.emplace_back(m);
  if (!t.eos_token.empty() && t.source.find("eos_token") != std::string::npos &&
      std::find(out.markers.begin(), out.markers.end(), t.eos_token) == out.markers.end())
    out.markers.push_back(t.eos_token);
  const Tokenizer& tok = ModelAccess::tokenizer(model);
  for (const std::string& m : out.markers) {
    auto ids = tok.Encode(m, /*add_special_tokens=*/false);
    if (ids.ok() && ids->size() == 1) out.ids.push_back(ids->front());
  }
  return out;
}

ChatTurns::ChatTurns(Session& session, ChatTemplate tmpl, std::string extra_vars_json)
    : session_(&session), tmpl_(std::move(tmpl)), extra_vars_json_(std::move(extra_vars_json)) {}

Result<std::vector<int32_t>> ChatTurns::Tokenize(const std::string& rendered) const {
  const Tokenizer& tok = ModelAccess::tokenizer(session_->model());
  const SpecialTokens& st = tok.special_tokens();
  // The tokenizer prepends its BOS: a template's own leading bos_token would make a second one.
  const bool drop_bos = st.add_bos && st.bos_id >= 0 && !tmpl_.bos_token.empty() && rendered.starts_with(tmpl_.bos_token);
  return tok.Encode(drop_bos ? rendered.substr(tmpl_.bos_token.size()) : rendered, /*add_special_tokens=*/true);
}

Result<ChatTurns::Prompt> ChatTurns::NextPrompt(const std::vector<ChatMessage>& messages) {
  Prompt p;
  NIBBLE_ASSIGN_OR_RETURN(p.rendered, RenderChat(tmpl_, messages, true, extra_vars_json_));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Tokenize(p.rendered));
  const std::vector<int32_t>& held = session_->tokens();
  const auto common = static_cast<size_t>(std::mismatch(held.begin(), held.end(), ids.begin(), ids.end()).second - ids.begin());
  const int64_t held_before = session_->position();
  NIBBLE_ASSIGN_OR_RETURN(p.reused_positions, session_->KeepCommonPrefix(ids));
  p.cut = p.reused_positions < held_before;
  if (p.cut) p.differs_at = common;
  p.ids.assign(ids.begin() + p.reused_positions, ids.end());
  return p;
}

}  // namespace nibble
