// Fuzz target: `nibble serve`'s request parser (src/serve/request.h) on arbitrary bodies, as
// completions, chat, tokenize and detokenize requests. Properties: no crash and no escaped
// exception; a refusal is a 400 with a message; an accepted request is within the limits the
// scheduler relies on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "serve/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto ep : {nibble::serve::Endpoint::kCompletions, nibble::serve::Endpoint::kChat}) {
    nibble::serve::ApiError e;
    auto r = nibble::serve::ParseCompletionRequest(body, ep, &e);
    if (!r) {
      if (e.status != 400 || e.message.empty()) std::abort();
      (void)nibble::serve::ErrorBody(e).dump();
      continue;
    }
    if (r->n < 1 || r->n > nibble::serve::kMaxChoices) std::abort();
    if (r->top_logprobs < 0 || r->top_logprobs > nibble::kMaxTopLogprobs) std::abort();
    if (r->max_tokens && *r->max_tokens < 0) std::abort();
    if (ep == nibble::serve::Endpoint::kCompletions && r->prompts.empty()) std::abort();
    if (ep == nibble::serve::Endpoint::kChat && r->messages.empty()) std::abort();
    for (const auto& s : r->stop)
      if (s.empty()) std::abort();
    const nibble::SamplingOptions& so = r->sampling;
    if (!(so.temperature >= 0 && so.temperature <= 2) || !(so.top_p > 0 && so.top_p <= 1) || so.top_k < 0 ||
        !(so.min_p >= 0 && so.min_p <= 1) || !(so.repeat_penalty > 0) ||
        !(so.presence_penalty >= -2 && so.presence_penalty <= 2) || !(so.frequency_penalty >= -2 && so.frequency_penalty <= 2))
      std::abort();
  }
  nibble::serve::ApiError e;
  (void)nibble::serve::ParseTokenizeRequest(body, &e);
  (void)nibble::serve::ParseDetokenizeRequest(body, &e);
  return 0;
}
