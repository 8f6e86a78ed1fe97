// The text stages of a Hugging Face tokenizer.json around its model: normalizers, pre-tokenizers
// and decoders, each parsed from its JSON object into a flat list of steps (a "Sequence" is
// flattened). Regexes run on PCRE2 (Unicode properties, lookahead, JIT); NFC is utf8proc's.
// Unknown types are errors naming the file, the JSON path and the type.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace nibble {

/// Where a JSON value came from, for errors: "FILE: PATH: ...".
struct JsonWhere {
  std::string file;
  std::string path;
  JsonWhere operator/(const std::string& key) const { return {file, path.empty() ? key : path + "." + key}; }
  JsonWhere operator[](size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  std::string str() const { return file + ": " + (path.empty() ? "(top level)" : path); }
};

/// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Immutable; safe to share.
class HfRegex {
 public:
  static Result<std::shared_ptr<const HfRegex>> Compile(const std::string& pattern, const JsonWhere& where);
  ~HfRegex();
  HfRegex(const HfRegex&) = delete;
  HfRegex& operator=(const HfRegex&) = delete;
  /// Called with each match [begin, end); returning false stops the search.
  using MatchFn = std::function<bool(size_t, size_t)>;
  /// Calls `fn` with the non-overlapping non-empty matches in valid UTF-8 `s`, in order; false
  /// when fn stopped it.
  bool ForEachMatch(std::string_view s, const MatchFn& fn) const;

 private:
  explicit HfRegex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8
};

/// A "pattern" object: {"String": s} (literal) or {"Regex": r}.
struct HfPattern {
  std::string literal;
  std::shared_ptr<const HfRegex> regex;
  static Result<HfPattern> Parse(const nlohmann::json& j, const JsonWhere& where);
  bool ForEachMatch(std::string_view s, const HfRegex::MatchFn& fn) const;
};

/// The GPT-2 byte <-> printable code point map of ByteLevel pre-tokenizer and decoder.
const std::string& ByteLevelChar(uint8_t b);
/// The byte a ByteLevel code point stands for, or -1.
int ByteLevelByte(uint32_t cp);

struct NormalizerStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string text;     // Prepend: what; Replace: the replacement
  HfPattern pattern;    // Replace
};

class HfNormalizer {
 public:
  /// `j` is tokenizer.json's "normalizer" (null: none).
  static Result<HfNormalizer> Parse(const nlohmann::json& j, const JsonWhere& where);
  std::string Apply(std::string s) const;
  bool empty() const { return steps_.empty(); }

 private:
  Status Add(const nlohmann::json& j, const JsonWhere& where);
  std::vector<NormalizerStep> steps_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel, kMetaspace, kDigits } kind;
  HfPattern pattern;  // Split (ByteLevel with use_regex: the GPT-2 pattern)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;   // ByteLevel
  bool use_regex = false;          // ByteLevel
  std::string replacement;         // Metaspace
  int prepend_scheme = 0;          // Metaspace: 0 always, 1 first, 2 never
  bool split = true;               // Metaspace
  bool individual_digits = false;  // Digits
};

class HfPreTokenizer {
 public:
  /// `j` is tokenizer.json's "pre_tokenizer" (null: the whole text is one word).
  static Result<HfPreTokenizer> Parse(const nlohmann::json& j, const JsonWhere& where);
  /// Called with each word in order; returning false stops the split.
  using WordSink = std::function<bool(std::string_view)>;
  /// Splits `text` (normalized) into the words the model encodes, passing each to `sink`;
  /// `at_start`: the text begins the input (Metaspace's prepend_scheme "first"). False when
  /// the sink stopped it.
  bool Apply(std::string_view text, bool at_start, const WordSink& sink) const;

 private:
  Status Add(const nlohmann::json& j, const JsonWhere& where);
  bool Run(size_t step, std::string_view word, bool first_word, const WordSink& sink) const;
  std::vector<PreTokenizerStep> steps_;
};

struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string from, to;       // Replace (literal pattern); Metaspace: from = replacement
  std::string strip_content;  // Strip
  int start = 0, stop = 0;    // Strip
  bool prepend = true;        // Metaspace: prepend_scheme != never
};

class HfDecoder {
 public:
  /// `j` is tokenizer.json's "decoder" (null: tokens are concatenated).
  static Result<HfDecoder> Parse(const nlohmann::json& j, const JsonWhere& where);
  /// The decoded bytes of `tokens` (may hold invalid UTF-8; the caller repairs it).
  std::string Apply(std::vector<std::string> tokens) const;

 private:
  Status Add(const nlohmann::json& j, const JsonWhere& where);
  std::vector<DecoderStep> steps_;
};

/// Reads a string / bool field of an object; errors name where, the key, expected and found.
Result<std::string> JsonString(const nlohmann::json& j, const std::string& key, const JsonWhere& where);
Result<bool> JsonBool(const nlohmann::json& j, const std::string& key, const JsonWhere& where, bool fallback);

}  // namespace nibble
