// Public API: stop reasons, raw log-probabilities of generated and prompt tokens.
#include <nibble/generate.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "api/logprobs.h"
#include "api/model_impl.h"
#include "kernels/vec_ops.h"

namespace nibble {

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kLength: return "max_new_tokens";
    case StopReason::kEos: return "eos";
    case StopReason::kStopToken: return "stop_token";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kCallback: return "callback";
  }
  return "unknown";
}

const char* FinishReason(StopReason r) {
  switch (r) {
    case StopReason::kLength:
    case StopReason::kContextFull: return "length";
    case StopReason::kCancelled: return "abort";
    default: return "stop";
  }
}

void FillLogprobs(const float* logits, int64_t vocab, int top_n, const StreamDecoder& stream, TokenEvent& ev) {
  // A server step runs this for every stream that asked for logprobs, on the thread the other
  // cores wait for: lanes the compiler vectorises and ExpF in stack chunks (within an ulp or two of
  // the double exp), summed in double. A scalar double exp per vocabulary entry took 0.26–0.30 ms
  // a token at vocab 32000 (this: 0.02–0.04 ms, log Z equal to 1e-9).
  constexpr int64_t kLanes = 8, kChunk = 512;
  float lane_max[kLanes];
  std::fill(lane_max, lane_max + kLanes, logits[0]);
  int64_t i = 0;
  for (; i + kLanes <= vocab; i += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lane_max[k] = logits[i + k] > lane_max[k] ? logits[i + k] : lane_max[k];
  float max = *std::max_element(lane_max, lane_max + kLanes);
  for (; i < vocab; ++i) max = logits[i] > max ? logits[i] : max;
  float e[kChunk];
  double part[kLanes] = {};
  for (int64_t i0 = 0; i0 < vocab; i0 += kChunk) {
    const int64_t len = std::min(kChunk, vocab - i0);
    std::copy(logits + i0, logits + i0 + len, e);
    ExpShiftedInPlace(e, len, -max);  // l + (−max) is l − max exactly
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int64_t k = 0; k < kLanes; ++k) part[k] += e[j + k];
    for (; j < len; ++j) part[0] += e[j];
  }
  double sum = 0;
  for (const double p : part) sum += p;
  const double log_z = max + std::log(sum);
  ev.logprob = static_cast<float>(logits[ev.id] - log_z);
  ev.top_logprobs.clear();
  if (top_n <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const auto n = static_cast<std::ptrdiff_t>(std::min<int64_t>(top_n, vocab));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (std::ptrdiff_t k = 0; k < n; ++k)
    ev.top_logprobs.push_back({ids[k], stream.Peek(ids[k]), static_cast<float>(logits[ids[k]] - log_z)});
}

Result<std::vector<TokenEvent>> PromptLogprobs(const Model& model, const std::vector<int32_t>& ids, int top_n,
                                               const CancellationToken* cancel) {
  if (top_n < 0 || top_n > kMaxTopLogprobs)
    return MakeError("top_logprobs ", top_n, " must be in [0, ", kMaxTopLogprobs, "]");
  if (ids.empty()) return MakeError("PromptLogprobs: no token ids");
  NIBBLE_ASSIGN_OR_RETURN(const std::vector<float> logits, model.Logits(ids, cancel));
  const int64_t vocab = static_cast<int64_t>(logits.size() / ids.size());
  StreamDecoder stream(ModelAccess::tokenizer(model));
  std::vector<TokenEvent> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    TokenEvent& ev = out[i];
    ev.id = ids[i];
    // Row i - 1 holds the distribution of the token at position i.
    if (i == 0) ev.logprob = std::numeric_limits<float>::quiet_NaN();
    else FillLogprobs(logits.data() + static_cast<int64_t>(i - 1) * vocab, vocab, top_n, stream, ev);
    ev.text = stream.Push(ids[i]);
  }
  out.back().text += stream.Flush();
  return out;
}

}  // namespace nibble
