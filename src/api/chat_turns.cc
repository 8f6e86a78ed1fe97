// Public API: end-of-turn markers and ChatTurns, the KV reuse of a conversation across turns.
//
// KV reuse: `fed_` is the text whose tokens the session holds (the rendered prompt plus the
// reply as streamed). A reply cut by -n leaves its last token for the next Generate call to run
// first (`unfed_`), which positions count in; `marks_` are the points where text length and
// position are known to agree. Besides the end of each prompt and reply, the end of the
// conversation without the generation prompt is one: templates such as Qwen3's with
// enable_thinking=false write `<think>\n\n</think>\n\n` after the open turn's header but not in
// a finished assistant turn, so the next render departs from the cache inside that header.
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

Result<ChatTurns::Prompt> ChatTurns::NextPrompt(const std::vector<ChatMessage>& messages) {
  NIBBLE_ASSIGN_OR_RETURN(std::string rendered, RenderChat(tmpl_, messages, true, extra_vars_json_));
  Prompt p;
  if (rendered.size() < fed_.size() || rendered.compare(0, fed_.size(), fed_) != 0) {
    size_t common = 0;
    while (common < std::min(fed_.size(), rendered.size()) && fed_[common] == rendered[common]) ++common;
    while (marks_.size() > 1 && marks_.back().text_len > common) marks_.pop_back();
    NIBBLE_RETURN_IF_ERROR(session_->Truncate(marks_.back().position));
    unfed_ = 0;
    fed_.resize(marks_.back().text_len);
    p.cut = true;
    p.differs_at = common;
  }
  p.text = rendered.substr(fed_.size());
  reused_ = p.reused_positions = session_->position();
  // On an empty session Generate prepends the tokenizer's BOS: a template's own bos_token goes.
  const SpecialTokens& st = ModelAccess::tokenizer(session_->model()).special_tokens();
  if (reused_ == 0 && st.add_bos && st.bos_id >= 0 && !tmpl_.bos_token.empty() &&
      p.text.compare(0, tmpl_.bos_token.size(), tmpl_.bos_token) == 0)
    p.text.erase(0, tmpl_.bos_token.size());
  pending_mark_.reset();
  auto closed = RenderChat(tmpl_, messages, false, extra_vars_json_);
  const size_t skipped = rendered.size() - p.text.size();  // the kept text plus a dropped bos_token
  if (closed.ok() && closed->size() > skipped && closed->size() < rendered.size() &&
      rendered.compare(0, closed->size(), *closed) == 0) {
    // A mark only where the prefix tokenizes as the start of the whole prompt's tokens.
    const Tokenizer& tok = ModelAccess::tokenizer(session_->model());
    auto head = tok.Encode(p.text.substr(0, closed->size() - skipped), reused_ == 0);
    auto whole = tok.Encode(p.text, reused_ == 0);
    if (head.ok() && whole.ok() && head->size() < whole->size() &&
        std::equal(head->begin(), head->end(), whole->begin()))
      pending_mark_ = Mark{reused_ + unfed_ + static_cast<int64_t>(head->size()), closed->size()};
  }
  fed_ = std::move(rendered);
  return p;
}

void ChatTurns::AddReply(const GenerateStats& stats, const std::string& reply, const std::string& end_marker) {
  if (pending_mark_) marks_.push_back(*pending_mark_);
  marks_.push_back({reused_ + unfed_ + stats.prompt_tokens, fed_.size()});
  fed_ += reply + end_marker;
  const bool at_stop_id = stats.stop_reason == StopReason::kEos || stats.stop_reason == StopReason::kStopToken;
  unfed_ = !at_stop_id && stats.generated_tokens > 0 ? 1 : 0;
  if (unfed_ == 0) marks_.push_back({session_->position(), fed_.size()});
}

}  // namespace nibble
