// OpenAI request bodies (/v1/completions, /v1/chat/completions) parsed into what the scheduler
// runs, and OpenAI's error object. Model-free: the token ids' range, the chat template and the
// context length are checked by the server with the model (server.cc). Unknown fields are
// ignored as OpenAI does; a known field of the wrong type or out of range is a 400 naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/chat.h>
#include <nibble/session.h>

namespace nibble::serve {

/// OpenAI's error object: {"error": {"message", "type", "param", "code"}} with the HTTP status.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the request field at fault ("" = null)
  std::string code;   // "" = null
  nlohmann::json extra = nlohmann::json::object();  // more members of "error" (n_prompt_tokens, n_ctx)
};
nlohmann::json ErrorBody(const ApiError& e);
/// The 400 of a field: message "`field`: what", param field.
ApiError FieldError(const std::string& field, const std::string& what);

enum class Endpoint { kCompletions, kChat };

/// One prompt of /v1/completions: text, or token ids as given.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::vector<PromptInput> prompts;   // completions: one or more (each gets n choices)
  std::vector<ChatMessage> messages;  // chat
  std::string chat_template_kwargs;   // chat: a JSON object text ("" = none)
  /// Tokens to generate; nullopt = until the context is full (chat's default). Completions
  /// default to 16 as OpenAI's.
  std::optional<int64_t> max_tokens;
  SamplingOptions sampling;           // OpenAI's defaults: temperature 1, top_p 1, top_k 0, min_p 0
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int n = 1;
  bool logprobs = false;
  int top_logprobs = 0;               // completions: the value of `logprobs`; chat: `top_logprobs`
  bool echo = false;                  // completions only
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
};

/// Limits of the parser: n choices, stop strings, top logprobs (OpenAI's are 128, 4, 20).
inline constexpr int kMaxChoices = 16;
inline constexpr int kMaxStops = 16;

/// Parses a request body. Errors (400): not JSON, not an object, a field of the wrong type or
/// out of range (param names it), a missing `prompt` / `messages`, an unsupported value (a
/// non-empty suffix).
std::optional<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint, ApiError* error);

/// The JSON body of /tokenize ({"content": text | "prompt": text, "add_special": bool,
/// "with_pieces": bool}) and /detokenize ({"tokens": [ids]}), checked likewise.
struct TokenizeRequest {
  std::string content;
  bool add_special = true;
  bool with_pieces = false;
};
std::optional<TokenizeRequest> ParseTokenizeRequest(std::string_view body, ApiError* error);
std::optional<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, ApiError* error);

/// Parses a JSON body into an object, or the 400 of malformed JSON / a non-object.
std::optional<nlohmann::json> ParseBodyObject(std::string_view body, ApiError* error);

}  // namespace nibble::serve
