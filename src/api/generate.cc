#include <algorithm>
#include <chrono>

#include "api/model_impl.h"
#include "model/sampler.h"

namespace nibble {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Streams text incrementally: the whole sequence is re-decoded each step (SentencePiece joins
// byte-fallback pieces and strips the dummy-prefix space only at the start), and the new suffix
// is emitted unless it ends in an incomplete UTF-8 sequence (decoded as U+FFFD), held back until
// the next piece completes it.
class TextStreamer {
 public:
  TextStreamer(const Tokenizer& tok, std::vector<int32_t> prompt, const std::function<void(std::string_view)>& out)
      : tok_(tok), ids_(std::move(prompt)), out_(out) {
    emitted_ = tok_.Decode(ids_).size();
  }
  void Push(int32_t id) {
    ids_.push_back(id);
    Emit(false);
  }
  void Flush() { Emit(true); }

 private:
  void Emit(bool final) {
    std::string text = tok_.Decode(ids_);
    if (!final && text.size() >= kReplacementChar.size() &&
        text.compare(text.size() - kReplacementChar.size(), kReplacementChar.size(), kReplacementChar) == 0)
      return;
    if (text.size() > emitted_) {
      out_(std::string_view(text).substr(emitted_));
      emitted_ = text.size();
    }
  }
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  const std::function<void(std::string_view)>& out_;
  size_t emitted_ = 0;
};

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
  TextStreamer streamer(tok, prompt, on_text);

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
    streamer.Push(next);
    ++stats.generated_tokens;
    if (i + 1 == options.max_new_tokens) break;
    if (cache.length >= cache.capacity) {
      stats.stop_reason = "context_full";
      break;
    }
    NIBBLE_RETURN_IF_ERROR(llama.Forward(&next, 1, cache, logits.data(), false));
  }
  streamer.Flush();
  stats.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  return stats;
}

}  // namespace nibble
