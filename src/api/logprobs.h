// Raw log-probabilities of one position's logits, shared by Generate's token events and
// PromptLogprobs (generate.h).
#pragma once

#include <cstdint>

#include <nibble/generate.h>

#include "tokenizer/stream_decoder.h"

namespace nibble {

/// Sets ev.logprob to log-softmax(logits)[ev.id] and ev.top_logprobs to the `top_n` most likely
/// ids (ties: lower id first), each with its text after what `stream` has shown (Peek). The
/// exponentials (ExpF, around the largest logit) are summed in double.
void FillLogprobs(const float* logits, int64_t vocab, int top_n, const StreamDecoder& stream, TokenEvent& ev);

}  // namespace nibble
