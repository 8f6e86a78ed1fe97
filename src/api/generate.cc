#include <algorithm>
#include <chrono>

#include "api/model_impl.h"
#include "model/sampler.h"
#include "tokenizer/stream_decoder.h"

namespace nibble {

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options,
                               const std::function<void(std::string_view)>& on_text) {
  const LlamaModel& llama = *model.impl().llama;
  const Tokenizer& tok = *model.impl().tokenizer;
  const ModelConfig& c = llama.config();
  if (options.max_new_tokens < 0) return MakeError("-n ", options.max_new_tokens, " must be >= 0");
  if (options.temperature < 0) return MakeError("--temperature ", options.temperature, " must be >= 0");
  if (options.top_p <= 0 || options.top_p > 1) return MakeError("--top_p ", options.top_p, " must be in (0, 1]");
  if (options.top_k < 0) return MakeError("--top_k ", options.top_k, " must be >= 0");
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, tok.Encode(options.prompt));
  if (prompt.empty()) return MakeError("empty prompt and the tokenizer adds no BOS token: nothing to start from");
  if (static_cast<int64_t>(prompt.size()) > c.max_position_embeddings)
    return MakeError("prompt is ", prompt.size(), " tokens, longer than max_position_embeddings (",
                     c.max_position_embeddings, ")");
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.stop_reason = "max_new_tokens";
  if (options.max_new_tokens == 0) return stats;

  const int64_t capacity = std::min<int64_t>(c.max_position_embeddings, stats.prompt_tokens + options.max_new_tokens);
  KvCache cache = llama.NewCache(capacity);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  Sampler sampler(SamplerOptions{options.temperature, options.top_k, options.top_p, options.seed});
  StreamDecoder stream(tok, prompt);
  auto emit = [&](const std::string& text) {
    if (!text.empty()) on_text(text);
  };

  for (int64_t i = 0; i < options.warmup; ++i) {  // first calls pay one-time GEMM kernel generation
    cache.length = 0;
    NIBBLE_RETURN_IF_ERROR(llama.Forward(prompt.data(), stats.prompt_tokens, cache, logits.data(), false));
  }
  cache.length = 0;
  auto t0 = std::chrono::steady_clock::now();
  NIBBLE_RETURN_IF_ERROR(llama.Forward(prompt.data(), stats.prompt_tokens, cache, logits.data(), false));
  auto t1 = std::chrono::steady_clock::now();
  stats.prefill_seconds = Seconds(t0, t1);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t next = sampler.Sample(logits.data(), c.vocab_size);
    if (std::find(tok.eos_ids().begin(), tok.eos_ids().end(), next) != tok.eos_ids().end()) {
      stats.stop_reason = "eos";
      break;
    }
    emit(stream.Push(next));
    ++stats.generated_tokens;
    if (i + 1 == options.max_new_tokens) break;
    if (cache.length >= cache.capacity) {
      stats.stop_reason = "context_full";
      break;
    }
    NIBBLE_RETURN_IF_ERROR(llama.Forward(&next, 1, cache, logits.data(), false));
  }
  emit(stream.Flush());
  stats.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  return stats;
}

}  // namespace nibble
