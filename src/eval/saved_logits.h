// Saved logits (`--save_logits` / `--kl_divergence_base FILE`): the float model's logits at every
// scored position of the perplexity windows, written once and read back instead of re-running the
// float model. Layout (docs/FORMATS.md "Saved logits"), little-endian:
//   40-byte header: "NIBLOGIT", u32 version (1), u32 vocab_size, u64 seq_len, u64 n_windows,
//                   u64 text_tokens (tokens of the whole text, BOS included)
//   int32 tokens[n_windows * seq_len]             the evaluated windows, as tokenized
//   fp32 logits[n_windows][seq_len - 1][vocab]     rows for positions 0..seq_len-2 of each window
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nibble/eval.h>

#include "base/result.h"
#include "io/file.h"

namespace nibble {

inline constexpr char kSavedLogitsMagic[8] = {'N', 'I', 'B', 'L', 'O', 'G', 'I', 'T'};
inline constexpr uint32_t kSavedLogitsVersion = 1;
inline constexpr int64_t kSavedLogitsHeaderBytes = 40;
/// `path` itself when it is not a directory, else path/kSavedLogitsFileName (<nibble/eval.h>).
std::string SavedLogitsPathFor(const std::string& path);

/// Writes a saved-logits file window by window (atomically: nothing at the path until Finish).
class SavedLogitsWriter {
 public:
  /// Writes the header and the tokens of the first `n_windows` windows of `tokens`.
  static Result<std::unique_ptr<SavedLogitsWriter>> Open(const std::string& path, int64_t vocab, int64_t seq_len,
                                                         int64_t n_windows, const std::vector<int32_t>& tokens);
  /// Appends one window's (seq_len - 1) x vocab logits rows.
  Status AddWindow(const float* logits);
  /// Errors when fewer windows were added than announced; else commits the file.
  Status Finish();

 private:
  std::unique_ptr<AtomicFileWriter> out_;
  std::string path_;
  int64_t row_floats_ = 0, n_windows_ = 0, added_ = 0;
};

/// A saved-logits file mapped read-only and checked against the run that reads it.
class SavedLogits {
 public:
  /// Maps and checks the header and the size. Errors name the file: not a saved-logits file,
  /// unsupported version, truncated or longer than its header says.
  static Result<std::unique_ptr<SavedLogits>> Open(const std::string& path);

  /// Errors naming the file and what differs when this run (the model's vocab, `seq_len`, the
  /// text's `tokens`, `n_windows` evaluated) does not match what was saved.
  Status CheckMatches(int64_t vocab, int64_t seq_len, int64_t n_windows, const std::vector<int32_t>& tokens) const;

  const std::string& path() const { return path_; }
  int64_t vocab() const { return vocab_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t n_windows() const { return n_windows_; }
  int64_t text_tokens() const { return text_tokens_; }
  /// Window w's tokens (seq_len of them) and its (seq_len - 1) x vocab logits rows.
  const int32_t* Tokens(int64_t w) const;
  const float* Logits(int64_t w) const;

 private:
  std::shared_ptr<MappedFile> file_;
  std::string path_;
  int64_t vocab_ = 0, seq_len_ = 0, n_windows_ = 0, text_tokens_ = 0;
};

}  // namespace nibble
