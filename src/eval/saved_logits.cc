#include "eval/saved_logits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace nibble {

namespace {

struct Header {
  char magic[8];
  uint32_t version, vocab;
  uint64_t seq_len, n_windows, text_tokens;
};
static_assert(sizeof(Header) == kSavedLogitsHeaderBytes, "the header is 40 bytes without padding");
struct CompactFields {
  uint32_t form, top_k;
};
static_assert(kSavedLogitsHeaderBytes + sizeof(CompactFields) == kSavedLogitsCompactHeaderBytes, "48-byte header");

template <class T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// max, and log Σ exp(row - max) in double.
void RowLogSumExp(const float* row, int64_t n, float* mx, double* lse) {
  float m = row[0];
  for (int64_t j = 1; j < n; ++j) m = row[j] > m ? row[j] : m;
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(row[j] - m));
  *mx = m;
  *lse = std::log(s);
}

}  // namespace

Result<SavedLogitsFormat> SavedLogitsFormat::Parse(const std::string& s) {
  SavedLogitsFormat f;
  if (s == "fp32") return f;
  if (s == "uint16") {
    f.form = kUint16;
    return f;
  }
  if (s.rfind("topk:", 0) == 0) {
    const std::string k = s.substr(5);
    char* end = nullptr;
    const long long v = k.empty() ? 0 : std::strtoll(k.c_str(), &end, 10);
    if (!k.empty() && end != nullptr && *end == '\0' && v >= 1 && v <= (1 << 24)) {
      f.form = kTopK;
      f.top_k = v;
      return f;
    }
  }
  return MakeError("--save_logits_format \"", s, "\": expected fp32, uint16 or topk:K (K a positive integer)");
}

std::string SavedLogitsFormat::name() const {
  switch (form) {
    case kFp32: return "fp32";
    case kUint16: return "uint16";
    case kTopK: return "topk:" + std::to_string(top_k);
  }
  return "?";
}

int64_t SavedLogitsFormat::RowBytes(int64_t vocab) const {
  switch (form) {
    case kFp32: return 4 * vocab;
    case kUint16: return 16 + 2 * (vocab + (vocab & 1));
    case kTopK: return 8 + 8 * top_k;
  }
  return 0;
}

std::string SavedLogitsPathFor(const std::string& path) {
  return IsDirectory(path) ? JoinPath(path, kSavedLogitsFileName) : path;
}

Result<std::unique_ptr<SavedLogitsWriter>> SavedLogitsWriter::Open(const std::string& path, int64_t vocab, int64_t seq_len,
                                                                   int64_t n_windows, const std::vector<int32_t>& tokens,
                                                                   SavedLogitsFormat format) {
  if (format.form == SavedLogitsFormat::kTopK && format.top_k > vocab)
    return MakeError("--save_logits_format topk:", format.top_k, ": k is larger than the vocab (", vocab, ")");
  std::unique_ptr<SavedLogitsWriter> w(new SavedLogitsWriter());
  auto out = AtomicFileWriter::Open(path);
  if (!out.ok()) return out.error().WithContext("--save_logits " + path);
  w->out_ = std::move(out).value();
  w->path_ = path;
  w->format_ = format;
  w->vocab_ = vocab;
  w->seq_len_ = seq_len;
  w->n_windows_ = n_windows;
  w->tokens_.assign(tokens.begin(), tokens.begin() + n_windows * seq_len);
  const bool compact = format.form != SavedLogitsFormat::kFp32;
  Header h;
  std::memcpy(h.magic, kSavedLogitsMagic, sizeof(h.magic));
  h.version = compact ? kSavedLogitsCompactVersion : kSavedLogitsVersion;
  h.vocab = static_cast<uint32_t>(vocab);
  h.seq_len = static_cast<uint64_t>(seq_len);
  h.n_windows = static_cast<uint64_t>(n_windows);
  h.text_tokens = tokens.size();
  NIBBLE_RETURN_IF_ERROR(w->out_->Write(&h, sizeof(h)));
  if (compact) {
    const CompactFields c{static_cast<uint32_t>(format.form), static_cast<uint32_t>(format.top_k)};
    NIBBLE_RETURN_IF_ERROR(w->out_->Write(&c, sizeof(c)));
  }
  NIBBLE_RETURN_IF_ERROR(w->out_->Write(w->tokens_.data(), sizeof(int32_t) * w->tokens_.size()));
  return w;
}

void SavedLogitsWriter::EncodeRow(const float* row, int32_t target, uint8_t* out) const {
  const int64_t vocab = vocab_;
  float mx;
  double lse;
  RowLogSumExp(row, vocab, &mx, &lse);
  const auto log_prob = [&](int64_t j) { return static_cast<float>(static_cast<double>(row[j] - mx) - lse); };
  if (format_.form == SavedLogitsFormat::kUint16) {
    float mn = mx;
    for (int64_t j = 0; j < vocab; ++j) mn = std::min(mn, row[j]);
    mn = std::max(mn, mx - kSavedLogitsUint16Range);
    const float scale = (mx - mn) / 65535.0f;
    Store(out, scale);
    Store(out + 4, static_cast<float>(static_cast<double>(mn - mx) - lse));
    Store(out + 8, log_prob(target));
    Store(out + 12, static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    uint8_t* q = out + 16;
    for (int64_t j = 0; j < vocab; ++j) {
      const float v = scale > 0 && row[j] > mn ? std::nearbyint((row[j] - mn) / scale) : 0.0f;
      Store(q + 2 * j, static_cast<uint16_t>(std::min(v, 65535.0f)));
    }
    if (vocab & 1) Store(q + 2 * vocab, uint16_t{0});
    return;
  }
  // topk: the k most probable (ties: lower id first) and the log of the rest's mass.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = format_.top_k;
  auto before = [&](int32_t a, int32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  double rest = 0;
  for (int64_t j = k; j < vocab; ++j) rest += std::exp(static_cast<double>(row[ids[static_cast<size_t>(j)]] - mx) - lse);
  Store(out, log_prob(target));
  Store(out + 4, rest > 0 ? static_cast<float>(std::log(rest)) : -std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < k; ++t) {
    Store(out + 8 + 8 * t, ids[static_cast<size_t>(t)]);
    Store(out + 12 + 8 * t, log_prob(ids[static_cast<size_t>(t)]));
  }
}

Status SavedLogitsWriter::AddWindow(const float* logits) {
  const int64_t rows = seq_len_ - 1;
  if (format_.form == SavedLogitsFormat::kFp32) {
    ++added_;
    return out_->Write(logits, sizeof(float) * static_cast<size_t>(rows * vocab_));
  }
  const int64_t row_bytes = format_.RowBytes(vocab_);
  std::vector<uint8_t> buf(static_cast<size_t>(rows * row_bytes));
  const int32_t* win = tokens_.data() + added_ * seq_len_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) EncodeRow(logits + i * vocab_, win[i + 1], buf.data() + i * row_bytes);
  ++added_;
  return out_->Write(buf.data(), buf.size());
}

Status SavedLogitsWriter::Finish() {
  if (added_ != n_windows_) return MakeError(path_, ": ", added_, " of ", n_windows_, " windows written");
  return out_->Commit();
}

int32_t SavedRow::top_id(int64_t i) const { return Load<int32_t>(top + 8 * i); }
float SavedRow::top_log_prob(int64_t i) const { return Load<float>(top + 8 * i + 4); }

namespace {

// Every row of a compact file: ids in range and numbers that are numbers, so a corrupt file is
// an error here and never an out-of-range read or a NaN statistic later.
Status CheckCompactRows(const SavedLogits& s) {
  const int64_t rows = s.seq_len() - 1;
  for (int64_t w = 0; w < s.n_windows(); ++w) {
    for (int64_t i = 0; i < rows; ++i) {
      const SavedRow r = s.Row(w, i);
      bool ok = std::isfinite(r.target_log_prob);
      if (r.form == SavedLogitsFormat::kUint16) {
        ok = ok && std::isfinite(r.scale) && r.scale >= 0 && std::isfinite(r.min_log_prob) && r.argmax >= 0 && r.argmax < s.vocab();
      } else {
        ok = ok && !std::isnan(r.rest_log_mass) && r.rest_log_mass <= 0;
        for (int64_t t = 0; ok && t < r.top_k; ++t)
          ok = r.top_id(t) >= 0 && r.top_id(t) < s.vocab() && std::isfinite(r.top_log_prob(t));
      }
      if (!ok) return MakeError(s.path(), ": corrupt ", s.format().name(), " row (window ", w, ", position ", i, ")");
    }
  }
  return Status::Ok();
}

}  // namespace

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
  if (h.version != kSavedLogitsVersion && h.version != kSavedLogitsCompactVersion)
    return MakeError(path, ": saved-logits version ", h.version, ", this nibble reads versions ", kSavedLogitsVersion, " and ",
                     kSavedLogitsCompactVersion);
  if (h.version == kSavedLogitsCompactVersion) {
    if (size < kSavedLogitsCompactHeaderBytes)
      return MakeError(path, ": truncated saved-logits file (", size, " bytes, the header alone is ", kSavedLogitsCompactHeaderBytes, ")");
    const auto c = Load<CompactFields>(s->file_->data() + kSavedLogitsHeaderBytes);
    const bool topk = c.form == SavedLogitsFormat::kTopK;
    if ((c.form != SavedLogitsFormat::kUint16 && !topk) || (topk ? c.top_k == 0 || c.top_k > h.vocab : c.top_k != 0))
      return MakeError(path, ": corrupt saved-logits header (form ", c.form, ", top_k ", c.top_k,
                       "; this nibble reads forms 1 uint16 and 2 topk with 1 <= top_k <= vocab)");
    s->format_.form = static_cast<SavedLogitsFormat::Form>(c.form);
    s->format_.top_k = c.top_k;
    s->header_bytes_ = kSavedLogitsCompactHeaderBytes;
  }
  if (h.vocab == 0 || h.seq_len < 2 || h.n_windows == 0 || h.seq_len > (1u << 24) || h.n_windows > (1u << 24) ||
      h.n_windows * h.seq_len > h.text_tokens ||
      4.0 * static_cast<double>(h.n_windows * h.seq_len) * (static_cast<double>(h.vocab) + 1) > 9e18)  // int64 sizes
    return MakeError(path, ": corrupt saved-logits header (vocab ", h.vocab, ", seq_len ", h.seq_len, ", windows ", h.n_windows,
                     ", text tokens ", h.text_tokens, ")");
  s->vocab_ = h.vocab;
  s->seq_len_ = static_cast<int64_t>(h.seq_len);
  s->n_windows_ = static_cast<int64_t>(h.n_windows);
  s->text_tokens_ = static_cast<int64_t>(h.text_tokens);
  const int64_t want = s->header_bytes_ + 4 * s->n_windows_ * s->seq_len_ +
                       s->n_windows_ * (s->seq_len_ - 1) * s->format_.RowBytes(s->vocab_);
  if (size != want)
    return MakeError(path, ": ", size < want ? "truncated" : "longer than its header says", " (", size, " bytes; ",
                     s->n_windows_, " windows of ", s->seq_len_, " tokens at vocab ", s->vocab_, " in form ", s->format_.name(),
                     " take ", want, ")");
  if (s->format_.form != SavedLogitsFormat::kFp32) NIBBLE_RETURN_IF_ERROR(CheckCompactRows(*s));
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
  return reinterpret_cast<const int32_t*>(file_->data() + header_bytes_) + w * seq_len_;
}

SavedRow SavedLogits::Row(int64_t w, int64_t i) const {
  const int64_t row_bytes = format_.RowBytes(vocab_);
  const uint8_t* p = file_->data() + header_bytes_ + 4 * n_windows_ * seq_len_ + (w * (seq_len_ - 1) + i) * row_bytes;
  SavedRow r;
  r.form = format_.form;
  switch (format_.form) {
    case SavedLogitsFormat::kFp32:
      r.logits = reinterpret_cast<const float*>(p);
      break;
    case SavedLogitsFormat::kUint16:
      r.scale = Load<float>(p);
      r.min_log_prob = Load<float>(p + 4);
      r.target_log_prob = Load<float>(p + 8);
      r.argmax = Load<int32_t>(p + 12);
      r.q = reinterpret_cast<const uint16_t*>(p + 16);
      break;
    case SavedLogitsFormat::kTopK:
      r.target_log_prob = Load<float>(p);
      r.rest_log_mass = Load<float>(p + 4);
      r.top = p + 8;
      r.top_k = format_.top_k;
      r.argmax = r.top_id(0);
      break;
  }
  return r;
}

}  // namespace nibble
