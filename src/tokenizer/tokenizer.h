// The tokenizer interface every layer above uses. Tokenizer::Load picks the implementation from
// the files of a model directory (tokenizer.model: SentencePiece, sentencepiece_tokenizer.h;
// tokenizer.json: the Hugging Face format, hf_tokenizer.h).
// The HF special-token rules are shared by all implementations and live here: BOS/EOS settings
// from tokenizer_config.json (`add_bos_token`, `add_eos_token`) and ids from config.json
// (`bos_token_id`, `eos_token_id`, `pad_token_id`), falling back to the tokenizer's own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace nibble {

/// Special-token ids and the rules of the HF default call (add_special_tokens=True).
struct SpecialTokens {
  int32_t bos_id = -1;           // -1: none
  std::vector<int32_t> eos_ids;  // empty: none; the first is the one Encode appends
  bool add_bos = true;
  bool add_eos = false;
  int32_t pad_id = -1;           // -1: none (batch padding; never generated)
};

/// Which tokenizer file Tokenizer::Load reads.
enum class TokenizerKind {
  kAuto,  // tokenizer.json when present and tokenizer.model absent, else tokenizer.model
  kHf,    // tokenizer.json
  kSpm,   // tokenizer.model (SentencePiece)
};

class Tokenizer {
 public:
  /// Loads the tokenizer of model directory `dir` as `kind` says. Errors: the file it needs is
  /// missing (names it; under kAuto names both); plus the implementation's load errors and
  /// ReadSpecialTokens'.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir, TokenizerKind kind = TokenizerKind::kAuto);
  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// Encodes UTF-8 text. With add_special_tokens (the HF default call) BOS is prepended when
  /// add_bos() and EOS appended when add_eos(). Errors: text that is not valid UTF-8 (names the
  /// byte offset).
  Result<std::vector<int32_t>> Encode(const std::string& text, bool add_special_tokens = true) const;

  /// Decodes ids to UTF-8 text: special tokens render as nothing, byte-fallback pieces are joined
  /// into characters, each byte of an invalid or incomplete sequence becomes U+FFFD. StreamDecoder
  /// relies on decoding being local: context matters only through leading-space handling at the
  /// start of the text and through byte pieces that form one character.
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  /// True for special (control) tokens such as BOS / EOS / padding, which Decode skips.
  virtual bool IsSpecial(int32_t id) const = 0;
  /// The vocabulary string of `id` ("▁Hello", "Ġworld", "<0x0A>"); empty when out of range.
  virtual std::string Piece(int32_t id) const = 0;
  /// "sentencepiece" or "tokenizer.json".
  virtual const char* kind_name() const = 0;

  const SpecialTokens& special_tokens() const { return special_; }
  int32_t bos_id() const { return special_.bos_id; }
  int32_t pad_id() const { return special_.pad_id; }
  const std::vector<int32_t>& eos_ids() const { return special_.eos_ids; }
  bool add_bos() const { return special_.add_bos; }
  bool add_eos() const { return special_.add_eos; }

 protected:
  explicit Tokenizer(SpecialTokens special) : special_(std::move(special)) {}
  void set_special_tokens(SpecialTokens special) { special_ = std::move(special); }
  /// Encodes valid UTF-8 text without special tokens.
  virtual Result<std::vector<int32_t>> EncodeText(const std::string& text) const = 0;

 private:
  SpecialTokens special_;
};

/// Applies `dir/tokenizer_config.json` and `dir/config.json` (both optional) to `defaults` (the
/// tokenizer's own ids, add_bos true, add_eos false); ids must lie in [0, vocab_size). Errors
/// (each names the file and key): malformed JSON, a non-boolean add_*_token, an id out of range,
/// add_bos_token true without a BOS id.
Result<SpecialTokens> ReadSpecialTokens(const std::string& dir, int32_t vocab_size, SpecialTokens defaults);

/// Byte offset of the first invalid UTF-8 sequence in `s`, or -1 when valid.
int64_t FirstInvalidUtf8(std::string_view s);
/// Length of the valid UTF-8 character starting at byte `i` of `s` (1-4), or 0 when the bytes
/// there are not one (overlong forms, surrogates and code points past U+10FFFF are not).
int Utf8CharLength(std::string_view s, size_t i);
/// `s` with each byte of an invalid or incomplete UTF-8 sequence replaced by U+FFFD.
std::string RepairUtf8(std::string_view s);

}  // namespace nibble
