// The chat loop: render, reuse the cached prefix, generate, append the reply.
//
// KV reuse: `fed` is the text whose tokens the session holds (the rendered prompt plus the reply
// as streamed). The next render normally starts with `fed` (the template writes the reply back
// verbatim), so only its tail is tokenized. When it does not (a template that trims or rewrites
// earlier turns), the cache is cut back to the last point where text and positions are known to
// agree (`marks`: the start, the end of every turn's prompt, the end of every reply that
// stopped at EOS or an end-of-turn id) and re-prefilled from there. A reply cut by -n leaves its last token for the
// next Generate call to run first (`unfed`), which positions count in.
#include "support/chat_loop.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "support/stop_strings.h"

namespace nibble_cli {

namespace {

// End-of-turn markers of common chat formats: a reply stops at one that the template writes
// (as a token id when the marker is one token, else as text), and at the model's EOS ids.
std::vector<std::string> EndOfTurnMarkers(const nibble::ChatTemplate& t) {
  std::vector<std::string> out;
  for (const char* m : {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|endoftext|>"})
    if (t.source.find(m) != std::string::npos) out.emplace_back(m);
  if (!t.eos_token.empty() && t.source.find("eos_token") != std::string::npos &&
      std::find(out.begin(), out.end(), t.eos_token) == out.end())
    out.push_back(t.eos_token);
  return out;
}

// The markers that are one token of the vocabulary (special added tokens such as <|eot_id|>):
// generation stops at that id itself, whatever the detokenizer shows for it.
std::vector<int32_t> MarkerIds(const nibble::Model& model, const std::vector<std::string>& markers) {
  auto bos = model.Tokenize("");
  const size_t skip = bos.ok() ? bos->size() : 0;  // the BOS the tokenizer prepends
  std::vector<int32_t> ids;
  for (const std::string& m : markers) {
    auto t = model.Tokenize(m);
    if (t.ok() && t->size() == skip + 1) ids.push_back(t->back());
  }
  return ids;
}

struct Mark {
  int64_t position;
  size_t text_len;
};

// The text of `rendered` to prefill now; cuts the session back when the cached text diverges.
std::string NewText(nibble::Session& s, const std::string& rendered, std::string& fed, std::vector<Mark>& marks,
                    int64_t& unfed) {
  if (rendered.compare(0, fed.size(), fed) == 0 && rendered.size() >= fed.size()) return rendered.substr(fed.size());
  size_t common = 0;
  while (common < std::min(fed.size(), rendered.size()) && fed[common] == rendered[common]) ++common;
  while (marks.size() > 1 && marks.back().text_len > common) marks.pop_back();
  std::fprintf(stderr, "chat: the rendered conversation differs from the cached text at byte %zu; re-prefilling from position %lld\n",
               common, static_cast<long long>(marks.back().position));
  s.Truncate(marks.back().position);
  unfed = 0;
  fed.resize(marks.back().text_len);
  return rendered.substr(fed.size());
}

// On an empty session Generate prepends the tokenizer's BOS: a template that writes bos_token
// itself then has it dropped from the text, so the prompt holds one BOS, not two.
std::string DropTemplateBos(const nibble::Model& model, const nibble::ChatTemplate& t, const std::string& text) {
  if (t.bos_token.empty() || text.compare(0, t.bos_token.size(), t.bos_token) != 0) return text;
  auto bos_only = model.Tokenize("");
  if (!bos_only.ok() || bos_only->size() != 1) return text;  // the tokenizer adds no BOS: keep the text
  return text.substr(t.bos_token.size());
}

}  // namespace

int RunChatLoop(const nibble::Model& model, const nibble::ChatTemplate& tmpl, const ChatLoopOptions& o, std::FILE* in,
                std::FILE* out) {
  auto session = nibble::Session::Create(model, o.session);
  if (!session.ok()) return std::fprintf(stderr, "nibble: error: %s\n", session.error().message.c_str()), 1;
  nibble::Session& s = **session;
  std::vector<nibble::ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system});
  const std::vector<std::string> markers = EndOfTurnMarkers(tmpl);
  const std::vector<int32_t> marker_ids = MarkerIds(model, markers);
  std::string fed;
  std::vector<Mark> marks = {{0, 0}};
  int64_t unfed = 0;
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
    auto rendered = nibble::RenderChat(tmpl, history, true, o.extra_vars_json);
    if (!rendered.ok()) return std::fprintf(stderr, "nibble: error: %s\n", rendered.error().message.c_str()), 1;
    std::string text = NewText(s, *rendered, fed, marks, unfed);
    const int64_t reused = s.position();
    fed = *rendered;
    nibble::GenerateOptions g;
    g.prompt = reused == 0 ? DropTemplateBos(model, tmpl, text) : text;
    g.max_new_tokens = o.max_new_tokens;
    g.sampling = o.sampling;
    g.stop_ids = marker_ids;
    StopStringFilter stop(markers);
    std::string reply;
    auto stats = nibble::Generate(s, g, [&](std::string_view piece) {
      const std::string shown = stop.Push(piece);
      reply += shown;
      std::fwrite(shown.data(), 1, shown.size(), out);
      std::fflush(out);
      return !stop.stopped();
    });
    if (!stats.ok()) return std::fprintf(stderr, "nibble: error: %s\n", stats.error().message.c_str()), 1;
    const std::string rest = stop.Flush();
    reply += rest;
    std::fwrite(rest.data(), 1, rest.size(), out);
    std::fputc('\n', out);
    std::fflush(out);
    marks.push_back({reused + unfed + stats->prompt_tokens, fed.size()});
    fed += reply + stop.matched();
    const bool at_stop_id = stats->stop_reason == "eos" || stats->stop_reason == "stop_token";
    unfed = !at_stop_id && stats->generated_tokens > 0 ? 1 : 0;
    if (unfed == 0) marks.push_back({s.position(), fed.size()});
    history.push_back({"assistant", reply});
    const int64_t decoded = stats->generated_tokens > 0 ? stats->generated_tokens - 1 : 0;
    std::fprintf(stderr,
                 "chat turn %d: reused %lld cached positions | prefill: %lld tokens in %.3f s | decode: %lld tokens in "
                 "%.3f s (%.1f tokens/s) | stop: %s\n",
                 turn, static_cast<long long>(reused), static_cast<long long>(stats->prompt_tokens), stats->prefill_seconds,
                 static_cast<long long>(decoded), stats->decode_seconds,
                 stats->decode_seconds > 0 ? decoded / stats->decode_seconds : 0.0,
                 stop.stopped() ? ("end of turn \"" + stop.matched() + "\"").c_str() : stats->stop_reason.c_str());
  }
  return 0;
}

}  // namespace nibble_cli
