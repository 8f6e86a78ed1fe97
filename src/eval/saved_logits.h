// Saved logits (`--save_logits` / `--kl_divergence_base FILE`): the float model's next-token
// distribution at every scored position of the perplexity windows, written once and read back
// instead of re-running the float model. Three forms (docs/FORMATS.md "Saved logits"), the form
// named by the header; little-endian:
//   header: "NIBLOGIT", u32 version, u32 vocab_size, u64 seq_len, u64 n_windows, u64 text_tokens;
//           version 2 adds u32 form (0 fp32, 1 uint16, 2 topk), u32 top_k
//   int32 tokens[n_windows * seq_len]             the evaluated windows, as tokenized
//   rows[n_windows][seq_len - 1]                  positions 0..seq_len-2 of each window:
//     fp32   (version 1): fp32 logits[vocab]
//     uint16 (version 2): fp32 scale, fp32 min_log_prob, fp32 target_log_prob, i32 argmax,
//                         u16 q[vocab] (+2 bytes when vocab is odd); log p_j = min_log_prob +
//                         scale * q_j over [max - 24, max], q_j = 0 below (read as p_j = 0)
//     topk   (version 2): fp32 target_log_prob, fp32 rest_log_mass, top_k x (i32 id, fp32 log p)
//                         by descending log p (ties: lower id first)
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
inline constexpr uint32_t kSavedLogitsVersion = 1;         // fp32 (the form every version reads)
inline constexpr uint32_t kSavedLogitsCompactVersion = 2;  // uint16 and topk
inline constexpr int64_t kSavedLogitsHeaderBytes = 40;     // version 1
inline constexpr int64_t kSavedLogitsCompactHeaderBytes = 48;
/// uint16 rows cover [max - this, max] of each row's log-probs; q = 0 stands for anything lower.
inline constexpr float kSavedLogitsUint16Range = 24.0f;
/// `path` itself when it is not a directory, else path/kSavedLogitsFileName (<nibble/eval.h>).
std::string SavedLogitsPathFor(const std::string& path);

/// How the rows are stored.
struct SavedLogitsFormat {
  enum Form : uint32_t { kFp32 = 0, kUint16 = 1, kTopK = 2 } form = kFp32;
  int64_t top_k = 0;  // kTopK
  /// "fp32", "uint16" or "topk:K" (1 <= K); errors name the flag and the accepted values.
  static Result<SavedLogitsFormat> Parse(const std::string& s);
  std::string name() const;
  /// Bytes of one row at `vocab` (vocab > 0; top_k <= vocab).
  int64_t RowBytes(int64_t vocab) const;
};

/// Writes a saved-logits file window by window (atomically: nothing at the path until Finish).
class SavedLogitsWriter {
 public:
  /// Writes the header and the tokens of the first `n_windows` windows of `tokens`. Errors: a
  /// top_k larger than the vocab, the file's.
  static Result<std::unique_ptr<SavedLogitsWriter>> Open(const std::string& path, int64_t vocab, int64_t seq_len,
                                                         int64_t n_windows, const std::vector<int32_t>& tokens,
                                                         SavedLogitsFormat format = {});
  /// Appends the next window's (seq_len - 1) x vocab logits rows, in the file's form.
  Status AddWindow(const float* logits);
  /// Errors when fewer windows were added than announced; else commits the file.
  Status Finish();

 private:
  void EncodeRow(const float* logits, int32_t target, uint8_t* out) const;

  std::unique_ptr<AtomicFileWriter> out_;
  std::string path_;
  SavedLogitsFormat format_;
  std::vector<int32_t> tokens_;  // the saved windows' tokens: the targets of the rows
  int64_t vocab_ = 0, seq_len_ = 0, n_windows_ = 0, added_ = 0;
};

/// One saved row, as the file holds it.
struct SavedRow {
  SavedLogitsFormat::Form form;
  const float* logits = nullptr;          // fp32
  const uint16_t* q = nullptr;            // uint16
  float scale = 0, min_log_prob = 0;      // uint16
  float target_log_prob = 0;              // uint16, topk
  int32_t argmax = 0;                     // uint16 (topk: ids[0])
  float rest_log_mass = 0;                // topk: log of 1 - the top-k's probability
  const uint8_t* top = nullptr;           // topk: top_k x (i32 id, fp32 log p)
  int64_t top_k = 0;
  int32_t top_id(int64_t i) const;
  float top_log_prob(int64_t i) const;
};

/// A saved-logits file mapped read-only and checked against the run that reads it.
class SavedLogits {
 public:
  /// Maps and checks the header and the size. Errors name the file: not a saved-logits file,
  /// unsupported version or form, a corrupt header, truncated or longer than its header says.
  static Result<std::unique_ptr<SavedLogits>> Open(const std::string& path);

  /// Errors naming the file and what differs when this run (the model's vocab, `seq_len`, the
  /// text's `tokens`, `n_windows` evaluated) does not match what was saved.
  Status CheckMatches(int64_t vocab, int64_t seq_len, int64_t n_windows, const std::vector<int32_t>& tokens) const;

  const std::string& path() const { return path_; }
  const SavedLogitsFormat& format() const { return format_; }
  int64_t vocab() const { return vocab_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t n_windows() const { return n_windows_; }
  int64_t text_tokens() const { return text_tokens_; }
  /// Window w's tokens (seq_len of them).
  const int32_t* Tokens(int64_t w) const;
  /// Window w, position i (0 .. seq_len - 2).
  SavedRow Row(int64_t w, int64_t i) const;

 private:
  std::shared_ptr<MappedFile> file_;
  std::string path_;
  SavedLogitsFormat format_;
  int64_t header_bytes_ = kSavedLogitsHeaderBytes;
  int64_t vocab_ = 0, seq_len_ = 0, n_windows_ = 0, text_tokens_ = 0;
};

}  // namespace nibble
