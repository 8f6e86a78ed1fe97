#include "tokenizer/stream_decoder.h"

#include <cstddef>
#include <string_view>
#include <utility>

namespace nibble {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, std::vector<int32_t> context)
    : tok_(tok), window_(std::move(context)) {
  read_ = window_.size();
  shown_ = tok_.Decode(window_).size();
}

std::string StreamDecoder::Push(int32_t id) {
  window_.push_back(id);
  return Emit(false);
}

std::string StreamDecoder::Flush() { return Emit(true); }

std::string StreamDecoder::Peek(int32_t id) const {
  std::vector<int32_t> window = window_;
  window.push_back(id);
  const std::string text = tok_.Decode(window);
  return text.size() > shown_ ? text.substr(shown_) : std::string();
}

// Each call decodes the window, not the whole sequence, so a long generation costs linear time.
// After an emission the anchor moves to where the emitted text began (a character boundary: text
// ending in an incomplete sequence is never emitted early), provided those ids decode on their own
// to non-empty text that ends the emitted text. Start-of-text rules (SentencePiece's dropped
// dummy-prefix space) then only touch text already shown, so later ids decode as in the whole
// sequence (Decode is local, tokenizer.h). Otherwise the anchor stays and the window grows.
std::string StreamDecoder::Emit(bool final) {
  const std::string text = tok_.Decode(window_);
  if (text.size() <= shown_) return {};
  if (!final && std::string_view(text).ends_with(kReplacementChar)) return {};
  std::string out = text.substr(shown_);
  if (read_ > 0) {
    std::vector<int32_t> tail(window_.begin() + static_cast<std::ptrdiff_t>(read_), window_.end());
    const std::string tail_text = tok_.Decode(tail);
    if (!tail_text.empty() && std::string_view(out).ends_with(tail_text)) {
      window_ = std::move(tail);
      read_ = window_.size();
      shown_ = tail_text.size();
      return out;
    }
  }
  read_ = window_.size();
  shown_ = text.size();
  return out;
}

}  // namespace nibble
