// OpenAI response shapes (openai_format.h).
#include "serve/openai_format.h"

#include <cmath>
#include <random>

namespace nibble::serve {

using json = nlohmann::json;

namespace {

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json Logprob(float lp) { return std::isnan(lp) ? json(nullptr) : json(lp); }

// The text as JSON: invalid UTF-8 (a partial character of a token) replaced, never a throw.
json Text(const std::string& s) { return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)); }

}  // namespace

json ChatLogprob(const std::string& token_text, const TokenEvent& ev) {
  json top = json::array();
  for (const TokenLogprob& t : ev.top_logprobs)
    top.push_back({{"token", Text(t.text)}, {"logprob", t.logprob}, {"bytes", Bytes(t.text)}});
  return {{"token", Text(token_text)}, {"logprob", Logprob(ev.logprob)}, {"bytes", Bytes(token_text)}, {"top_logprobs", top}};
}

void CompletionLogprobs::Add(const std::string& token_text, const TokenEvent& ev) {
  tokens.push_back(Text(token_text));
  token_logprobs.push_back(Logprob(ev.logprob));
  if (std::isnan(ev.logprob)) {
    top_logprobs.push_back(nullptr);
  } else {
    json top = json::object();
    for (const TokenLogprob& t : ev.top_logprobs) top[Text(t.text).get<std::string>()] = t.logprob;
    top_logprobs.push_back(top);
  }
  text_offset.push_back(offset);
  offset += static_cast<int64_t>(token_text.size());
}

json CompletionLogprobs::Json() const {
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", text_offset}};
}

json Usage::Json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json ResponseHead::Object(bool chunk) const {
  const char* object = endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"system_fingerprint", nullptr}};
}

json FullResponse(const ResponseHead& head, const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json out = head.Object(false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", c.finish_reason}};
    if (head.endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", Text(c.text)}};
      choice["logprobs"] = head.logprobs ? json{{"content", c.chat_logprobs}} : json(nullptr);
    } else {
      choice["text"] = Text(c.text);
      choice["logprobs"] = head.logprobs ? c.completion_logprobs.Json() : json(nullptr);
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage.Json();
  return out;
}

std::string SseData(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json ChatChunk(const ResponseHead& head, int index, const json& delta, const json& logprobs,
               const std::string& finish_reason, bool include_usage) {
  json out = head.Object(true);
  out["choices"] = json::array({{{"index", index},
                                 {"delta", delta},
                                 {"logprobs", logprobs},
                                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}}});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json CompletionChunk(const ResponseHead& head, int index, const std::string& text, const json& logprobs,
                     const std::string& finish_reason, bool include_usage) {
  json out = head.Object(true);
  out["choices"] = json::array({{{"index", index},
                                 {"text", Text(text)},
                                 {"logprobs", logprobs},
                                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}}});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json UsageChunk(const ResponseHead& head, const Usage& usage) {
  json out = head.Object(true);
  out["choices"] = json::array();
  out["usage"] = usage.Json();
  return out;
}

std::string NewId(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%012llx%012llx", static_cast<unsigned long long>(rng() & 0xffffffffffffULL),
                static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return prefix + buf;
}

}  // namespace nibble::serve
