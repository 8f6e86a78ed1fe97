// Incremental detokenization through the Tokenizer interface: ids arrive one at a time and each
// call returns the text they complete. The pieces concatenate exactly to the Decode of all ids
// (after the context), and each piece is whole UTF-8 characters: text ending in an incomplete
// UTF-8 sequence (decoded as U+FFFD) is held back until the next id completes it, or Flush.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace nibble {

class StreamDecoder {
 public:
  /// `context` (e.g. the prompt) counts as text already shown; it should end on a complete
  /// character, as Encode's output does. `tok` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tok, std::vector<int32_t> context = {});

  /// Appends `id`; returns the new text (empty while nothing new is complete).
  std::string Push(int32_t id);
  /// Returns the text still held back (an incomplete sequence as U+FFFD); call once at the end.
  std::string Flush();
  /// The text not shown yet if `id` came next, an incomplete sequence as U+FFFD (the text of a
  /// candidate token in context, e.g. a top logprob's); changes nothing.
  std::string Peek(int32_t id) const;

 private:
  std::string Emit(bool final);

  const Tokenizer& tok_;
  // window_ holds the ids from an anchor on; window_[0, read_) decodes (from the anchor) to the
  // shown_ bytes already returned, window_[read_, end) is not shown yet.
  std::vector<int32_t> window_;
  size_t read_ = 0;
  size_t shown_ = 0;
};

}  // namespace nibble
