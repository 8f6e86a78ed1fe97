#include "eval/saved_logits.h"

#include <cstring>

namespace nibble {

namespace {

struct Header {
  char magic[8];
  uint32_t version, vocab;
  uint64_t seq_len, n_windows, text_tokens;
};
static_assert(sizeof(Header) == kSavedLogitsHeaderBytes, "the header is 40 bytes without padding");

int64_t FileBytes(int64_t vocab, int64_t seq_len, int64_t n_windows) {
  return kSavedLogitsHeaderBytes + 4 * n_windows * seq_len + 4 * n_windows * (seq_len - 1) * vocab;
}

}  // namespace

std::string SavedLogitsPathFor(const std::string& path) {
  return IsDirectory(path) ? JoinPath(path, kSavedLogitsFileName) : path;
}

Result<std::unique_ptr<SavedLogitsWriter>> SavedLogitsWriter::Open(const std::string& path, int64_t vocab, int64_t seq_len,
                                                                   int64_t n_windows, const std::vector<int32_t>& tokens) {
  std::unique_ptr<SavedLogitsWriter> w(new SavedLogitsWriter());
  auto out = AtomicFileWriter::Open(path);
  if (!out.ok()) return out.error().WithContext("--save_logits " + path);
  w->out_ = std::move(out).value();
  w->path_ = path;
  w->row_floats_ = (seq_len - 1) * vocab;
  w->n_windows_ = n_windows;
  Header h;
  std::memcpy(h.magic, kSavedLogitsMagic, sizeof(h.magic));
  h.version = kSavedLogitsVersion;
  h.vocab = static_cast<uint32_t>(vocab);
  h.seq_len = static_cast<uint64_t>(seq_len);
  h.n_windows = static_cast<uint64_t>(n_windows);
  h.text_tokens = tokens.size();
  NIBBLE_RETURN_IF_ERROR(w->out_->Write(&h, sizeof(h)));
  NIBBLE_RETURN_IF_ERROR(w->out_->Write(tokens.data(), sizeof(int32_t) * static_cast<size_t>(n_windows * seq_len)));
  return w;
}

Status SavedLogitsWriter::AddWindow(const float* logits) {
  ++added_;
  return out_->Write(logits, sizeof(float) * static_cast<size_t>(row_floats_));
}

Status SavedLogitsWriter::Finish() {
  if (added_ != n_windows_) return MakeError(path_, ": ", added_, " of ", n_windows_, " windows written");
  return out_->Commit();
}

Result<std::unique_ptr<SavedLogits>> SavedLogits::Open(const std::string& path) {
  auto file = MappedFile::Open(path);
  if (!file.ok()) return file.error().WithContext("saved logits");
  std::unique_ptr<SavedLogits> s(new SavedLogits());
  s->file_ = std::move(file).value();
  s->path_ = path;
  const int64_t size = static_cast<int64_t>(s->file_->size());
  if (size < kSavedLogitsHeaderBytes)
    return MakeError(path, ": truncated saved-logits file (", size, " bytes, the header alone is ", kSavedLogitsHeaderBytes, ")");
  Header h;
  std::memcpy(&h, s->file_->data(), sizeof(h));
  if (std::memcmp(h.magic, kSavedLogitsMagic, sizeof(h.magic)) != 0)
    return MakeError(path, ": not a nibble saved-logits file (no \"NIBLOGIT\" magic; written by --save_logits?)");
  if (h.version != kSavedLogitsVersion)
    return MakeError(path, ": saved-logits version ", h.version, ", this nibble reads version ", kSavedLogitsVersion);
  if (h.vocab == 0 || h.seq_len < 2 || h.n_windows == 0 || h.seq_len > (1u << 24) || h.n_windows > (1u << 24) ||
      h.n_windows * h.seq_len > h.text_tokens ||
      4.0 * static_cast<double>(h.n_windows * h.seq_len) * (static_cast<double>(h.vocab) + 1) > 9e18)  // int64 sizes
    return MakeError(path, ": corrupt saved-logits header (vocab ", h.vocab, ", seq_len ", h.seq_len, ", windows ", h.n_windows,
                     ", text tokens ", h.text_tokens, ")");
  s->vocab_ = h.vocab;
  s->seq_len_ = static_cast<int64_t>(h.seq_len);
  s->n_windows_ = static_cast<int64_t>(h.n_windows);
  s->text_tokens_ = static_cast<int64_t>(h.text_tokens);
  const int64_t want = FileBytes(s->vocab_, s->seq_len_, s->n_windows_);
  if (size != want)
    return MakeError(path, ": ", size < want ? "truncated" : "longer than its header says", " (", size, " bytes; ",
                     s->n_windows_, " windows of ", s->seq_len_, " tokens at vocab ", s->vocab_, " take ", want, ")");
  return s;
}

Status SavedLogits::CheckMatches(int64_t vocab, int64_t seq_len, int64_t n_windows, const std::vector<int32_t>& tokens) const {
  if (vocab != vocab_) return MakeError(path_, ": saved at vocab size ", vocab_, ", the model has vocab size ", vocab);
  if (seq_len != seq_len_) return MakeError(path_, ": saved with --seq_len ", seq_len_, ", this run uses --seq_len ", seq_len);
  if (static_cast<int64_t>(tokens.size()) != text_tokens_)
    return MakeError(path_, ": the saved text has ", text_tokens_, " tokens, this text has ", tokens.size(),
                     " (a different text or tokenizer)");
  if (n_windows > n_windows_)
    return MakeError(path_, ": holds ", n_windows_, " windows, this run evaluates ", n_windows, " (use --max_windows ", n_windows_,
                     " or save more windows)");
  const int32_t* saved = Tokens(0);
  for (int64_t i = 0; i < n_windows * seq_len; ++i)
    if (saved[i] != tokens[static_cast<size_t>(i)])
      return MakeError(path_, ": token ", i, " (window ", i / seq_len, ", position ", i % seq_len, ") is ", saved[i],
                       " in the file but ", tokens[static_cast<size_t>(i)], " in this text (a different text or tokenizer)");
  return Status::Ok();
}

const int32_t* SavedLogits::Tokens(int64_t w) const {
  return reinterpret_cast<const int32_t*>(file_->data() + kSavedLogitsHeaderBytes) + w * seq_len_;
}

const float* SavedLogits::Logits(int64_t w) const {
  const uint8_t* base = file_->data() + kSavedLogitsHeaderBytes + 4 * n_windows_ * seq_len_;
  return reinterpret_cast<const float*>(base) + w * (seq_len_ - 1) * vocab_;
}

}  // namespace nibble
