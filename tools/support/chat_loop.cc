// The chat loop: read a user line, let the library's ChatTurns give the prompt ids past the
// cached prefix, generate until an end-of-turn marker, print the reply and the turn's statistics.
// Ctrl-C / SIGTERM during a reply (CancelOnSignal, installed for the Generate call only, so that
// at the input line a Ctrl-C keeps its default action) ends it and the chat: exit 130 / 143.
#include "support/chat_loop.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/cancel_signal.h"

namespace nibble_cli {

int RunChatLoop(const nibble::Model& model, const nibble::ChatTemplate& tmpl, const ChatLoopOptions& o, std::FILE* in,
                std::FILE* out) {
  auto session = nibble::Session::Create(model, o.session);
  if (!session.ok()) return std::fprintf(stderr, "nibble: error: %s\n", session.error().message.c_str()), 1;
  nibble::Session& s = **session;
  std::vector<nibble::ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system});
  const nibble::EndOfTurn eot = nibble::EndOfTurnFor(model, tmpl);
  nibble::ChatTurns turns(s, tmpl, o.extra_vars_json);
  std::string line;
  for (int turn = 1;; ++turn) {
    line.clear();
    if (!o.prompt_marker.empty()) {
      std::fputs(o.prompt_marker.c_str(), out);
      std::fflush(out);
    }
    int c;
    while ((c = std::fgetc(in)) != EOF && c != '\n') line += static_cast<char>(c);
    if (c == EOF && line.empty()) {
      if (!o.prompt_marker.empty()) std::fputc('\n', out);  // end the marker's line
      break;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    history.push_back({"user", line});
    auto prompt = turns.NextPrompt(history);
    if (!prompt.ok()) return std::fprintf(stderr, "nibble: error: %s\n", prompt.error().message.c_str()), 1;
    if (prompt->cut)
      std::fprintf(stderr, "chat: the rendered conversation differs from the cached tokens at token %zu; re-prefilling from position %lld\n",
                   prompt->differs_at, static_cast<long long>(prompt->reused_positions));
    // A full context ends the chat at this turn boundary, as EOF does (the reply would not fit).
    const auto need = static_cast<int64_t>(prompt->ids.size());
    if (s.position() + need >= s.capacity()) {
      std::fprintf(stderr, "chat: the conversation (%lld tokens) no longer fits the context of %lld positions (--ctx_size); ending the chat\n",
                   static_cast<long long>(s.position() + need), static_cast<long long>(s.capacity()));
      break;
    }
    nibble::GenerateOptions g;
    g.prompt_ids = prompt->ids;
    g.max_new_tokens = o.max_new_tokens;
    g.sampling = o.sampling;
    g.stop_ids = eot.ids;
    g.stop = eot.markers;
    std::string reply;
    std::optional<CancelOnSignal> on_signal(std::in_place);
    g.cancel = on_signal->token();
    auto stats = nibble::Generate(s, g, [&](std::string_view piece) {
      reply += piece;
      std::fwrite(piece.data(), 1, piece.size(), out);
      std::fflush(out);
      return true;
    });
    on_signal.reset();
    if (!stats.ok() && stats.error().code == nibble::ErrorCode::kCancelled) return FailCancelled(stats.error().message);
    if (!stats.ok()) return std::fprintf(stderr, "nibble: error: %s\n", stats.error().message.c_str()), 1;
    std::fputc('\n', out);
    std::fflush(out);
    history.push_back({"assistant", reply});
    const int64_t decoded = stats->generated_tokens > 0 ? stats->generated_tokens - 1 : 0;
    std::fprintf(stderr,
                 "chat turn %d: reused %lld cached positions | prefill: %lld tokens in %.3f s | decode: %lld tokens in "
                 "%.3f s (%.1f tokens/s) | stop: %s\n",
                 turn, static_cast<long long>(prompt->reused_positions), static_cast<long long>(stats->prompt_tokens),
                 stats->prefill_seconds, static_cast<long long>(decoded), stats->decode_seconds,
                 stats->decode_seconds > 0 ? decoded / stats->decode_seconds : 0.0,
                 stats->stop_reason == nibble::StopReason::kStopString ? ("end of turn \"" + stats->stop_string + "\"").c_str()
                                                                       : nibble::StopReasonName(stats->stop_reason));
    if (stats->stop_reason == nibble::StopReason::kCancelled) return CancelledExitCode(CancelSignal());
  }
  return 0;
}

}  // namespace nibble_cli
