// OpenAI response shapes: logprobs of chat and completions choices, the non-streamed response,
// server-sent event chunks and usage, built from the scheduler's events (scheduler.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/generate.h>

#include "serve/request.h"
#include "serve/scheduler.h"

namespace nibble::serve {

/// A chat `logprobs.content` entry: {"token", "logprob", "bytes", "top_logprobs": [...]}.
nlohmann::json ChatLogprob(const std::string& token_text, const TokenEvent& ev);

/// A completions choice's logprobs ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}),
/// grown a token at a time; a prompt token's logprob NaN is OpenAI's null.
struct CompletionLogprobs {
  nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                 top_logprobs = nlohmann::json::array(), text_offset = nlohmann::json::array();
  int64_t offset = 0;  // bytes of text before the next token
  void Add(const std::string& token_text, const TokenEvent& ev);
  nlohmann::json Json() const;
};

/// What a request's events add up to, per choice and in total.
struct ChoiceResult {
  std::string text;
  nlohmann::json chat_logprobs = nlohmann::json::array();
  CompletionLogprobs completion_logprobs;
  std::string finish_reason;
  std::string error;
  bool done = false;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  nlohmann::json Json() const;
};

/// The fields every response object of one request shares.
struct ResponseHead {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  Endpoint endpoint = Endpoint::kCompletions;
  bool logprobs = false;
  /// The object: the response's or a chunk's ("chat.completion", "chat.completion.chunk",
  /// "text_completion").
  nlohmann::json Object(bool chunk) const;
};

/// The non-streamed response body.
nlohmann::json FullResponse(const ResponseHead& head, const std::vector<ChoiceResult>& choices, const Usage& usage);

/// One server-sent event: "data: <json>\n\n".
std::string SseData(const nlohmann::json& j);
/// A chat chunk for choice `index`: `delta` ({"role"...} / {"content"...} / {}), logprobs
/// (null unless asked), finish_reason (null while running); with include_usage, "usage": null.
nlohmann::json ChatChunk(const ResponseHead& head, int index, const nlohmann::json& delta, const nlohmann::json& logprobs,
                         const std::string& finish_reason, bool include_usage);
/// A completions chunk for choice `index`.
nlohmann::json CompletionChunk(const ResponseHead& head, int index, const std::string& text, const nlohmann::json& logprobs,
                               const std::string& finish_reason, bool include_usage);
/// The usage-only chunk sent last when stream_options.include_usage: "choices": [].
nlohmann::json UsageChunk(const ResponseHead& head, const Usage& usage);

/// A fresh id with `prefix` ("chatcmpl-"): 24 random hex digits.
std::string NewId(const std::string& prefix);

}  // namespace nibble::serve
