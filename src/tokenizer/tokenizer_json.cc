#include "tokenizer/tokenizer_json.h"

#include <algorithm>
#include <utility>

#include "base/strings.h"
#include "io/json.h"
#include "tokenizer/hf_text.h"

namespace nibble {

using nlohmann::json;

std::string RawMerges::Json(const Entry& e) const {
  if (e.pair_form) return json::array({std::string(left(e)), std::string(right(e))}).dump();
  return json(std::string(left(e)) + " " + std::string(right(e))).dump();
}

bool TokenVocab::Add(std::string_view token, int32_t id) {
  if (2 * (size_ + 1) > slots_.size()) Grow();
  const uint64_t h = Hash(token);
  const auto tag = static_cast<uint32_t>(h >> 32);
  size_t i = h & mask_;
  for (; slots_[i].id >= 0; i = (i + 1) & mask_)
    if (slots_[i].tag == tag && slots_[i].len == token.size() && Equal(bytes_.data() + slots_[i].offset, token))
      return false;
  slots_[i] = {tag, static_cast<uint32_t>(bytes_.size()), static_cast<uint32_t>(token.size()), id};
  bytes_.append(token);
  ++size_;
  return true;
}

void TokenVocab::Grow(size_t min_slots) {
  std::vector<Slot> old = std::move(slots_);
  size_t cap = std::max<size_t>(1024, 2 * old.size());
  while (cap < min_slots) cap *= 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    size_t i = Hash(std::string_view(bytes_).substr(s.offset, s.len)) & mask_;
    while (slots_[i].id >= 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

namespace {

// Builds the DOM as nlohmann's own SAX DOM parser does (a stack of the open containers), except
// for the values of model.vocab and model.merges, which go into the flat tables. The first error
// stops the parse, except a duplicate key, which is reported only when the text parses (as
// ParseJsonText does).
class Handler final : public nlohmann::json_sax<json> {
 public:
  Handler(TokenizerJson* out, const std::string& file) : out_(out), where_{file, ""} {}

  bool null() override { return Value(json(nullptr), "null"); }
  bool boolean(bool v) override { return Value(json(v), v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return Integer(v, json(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return Integer(v > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v), json(v));
  }
  const Error& error() const { return error_; }
  bool number_float(number_float_t v, const string_t& text) override { return Value(json(v), text); }
  bool string(string_t& s) override;
  bool binary(binary_t&) override { return Fail(where_.str(), ": unexpected binary value"); }
  bool start_object(std::size_t) override;
  bool key(string_t& k) override;
  bool end_object() override;
  bool start_array(std::size_t) override;
  bool end_array() override;
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = MakeErrorCode(ErrorCode::kCorruptInput, where_.file, ": not valid JSON (", PrintableBytes(e.what()), ")");
    return false;
  }

  Status Finish();

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  template <class... Args>
  bool Fail(Args&&... args) {
    error_ = MakeError(std::forward<Args>(args)...);
    return false;
  }
  // The slot of a new value in the DOM: the root, the next array element, or the pending key's.
  json* Place(json&& v);
  bool Value(json&& v, const std::string& text);
  bool Integer(int64_t v, json&& j);
  bool Open(json::value_t type);
  bool BadMerge(const std::string& found);
  JsonWhere VocabWhere() const { return where_ / "model" / "vocab" / json(key_).dump(); }
  // The merge being read: a pair whose first string was read already has its entry.
  JsonWhere MergeWhere() const {
    const size_t n = out_->merges.entries.size();
    return (where_ / "model" / "merges")[mode_ == Mode::kMergePair && pair_strings_ > 0 ? n - 1 : n];
  }
  // True when the container about to open is the value of model.<name> of the top-level object.
  bool AtModelKey(const char* name) const {
    return stack_.size() == 2 && stack_[0]->is_object() && stack_[1]->is_object() && frame_keys_[1] == "model" && key_ == name;
  }

  TokenizerJson* out_;
  JsonWhere where_;
  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;             // the open DOM containers
  std::vector<std::string> frame_keys_;  // the key each was opened under ("" in an array)
  std::string key_;                      // the pending object key
  json* slot_ = nullptr;                 // the pending key's value in the DOM
  std::string duplicate_;
  int pair_strings_ = 0;                 // strings seen in the current ["a", "b"]
  Error error_;
};

json* Handler::Place(json&& v) {
  if (stack_.empty()) {
    out_->doc = std::move(v);
    return &out_->doc;
  }
  if (stack_.back()->is_array()) {
    stack_.back()->push_back(std::move(v));
    return &stack_.back()->back();
  }
  *slot_ = std::move(v);
  return slot_;
}

bool Handler::Value(json&& v, const std::string& text) {
  switch (mode_) {
    case Mode::kDom:
      Place(std::move(v));
      return true;
    case Mode::kVocab:
      return Fail(VocabWhere().str(), ": expected a token id in [0, 2^30), found ", text);
    case Mode::kMerges:
    case Mode::kMergePair:
      return BadMerge(text);
  }
  return false;
}

bool Handler::Integer(int64_t v, json&& j) {
  if (mode_ == Mode::kDom) {
    Place(std::move(j));
    return true;
  }
  if (mode_ != Mode::kVocab) return BadMerge(j.dump());
  if (v < 0 || v >= (int64_t{1} << 30))
    return Fail(VocabWhere().str(), ": expected a token id in [0, 2^30), found ", j.dump());
  const auto id = static_cast<int32_t>(v);
  if (!out_->vocab.Add(key_, id)) {
    error_ = MakeErrorCode(ErrorCode::kCorruptInput, where_.file, ": duplicate key \"", key_, "\"");
    return false;
  }
  out_->vocab_id_end = std::max(out_->vocab_id_end, id + 1);
  return true;
}

bool Handler::BadMerge(const std::string& found) {
  return Fail(MergeWhere().str(), ": expected a merge \"a b\" or [\"a\", \"b\"], found ", found.substr(0, 120));
}

bool Handler::string(string_t& s) {
  RawMerges& m = out_->merges;
  if (mode_ == Mode::kMerges) {
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
      return BadMerge(json(s).dump());
    m.entries.push_back({static_cast<uint32_t>(m.bytes.size()), static_cast<uint32_t>(sp),
                         static_cast<uint32_t>(s.size() - sp - 1), false});
    m.bytes.append(s, 0, sp);
    m.bytes.append(s, sp + 1);
    return true;
  }
  if (mode_ == Mode::kMergePair) {
    if (++pair_strings_ > 2) return BadMerge("an array of more than 2 items");
    if (pair_strings_ == 1) {
      m.entries.push_back({static_cast<uint32_t>(m.bytes.size()), static_cast<uint32_t>(s.size()), 0, true});
    } else {
      m.entries.back().right_len = static_cast<uint32_t>(s.size());
    }
    m.bytes += s;
    return true;
  }
  if (mode_ == Mode::kVocab) return Fail(VocabWhere().str(), ": expected a token id in [0, 2^30), found ", json(s).dump().substr(0, 120));
  Place(json(std::move(s)));
  return true;
}

bool Handler::Open(json::value_t type) {
  if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
    error_ = MakeErrorCode(ErrorCode::kCorruptInput, where_.file, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
    return false;
  }
  const bool in_object = !stack_.empty() && stack_.back()->is_object();
  stack_.push_back(Place(json(type)));
  frame_keys_.push_back(in_object ? key_ : std::string());
  return true;
}

bool Handler::start_object(std::size_t) {
  switch (mode_) {
    case Mode::kVocab: return Fail(VocabWhere().str(), ": expected a token id in [0, 2^30), found an object");
    case Mode::kMerges:
    case Mode::kMergePair: return BadMerge("an object");
    case Mode::kDom: break;
  }
  if (AtModelKey("vocab")) {
    Place(json::object());  // a placeholder, so that a second "vocab" key is a duplicate
    out_->has_vocab = true;
    mode_ = Mode::kVocab;
    return true;
  }
  return Open(json::value_t::object);
}

bool Handler::key(string_t& k) {
  if (mode_ == Mode::kVocab) {
    key_ = std::move(k);
    return true;
  }
  json& obj = *stack_.back();
  if (obj.contains(k) && duplicate_.empty()) duplicate_ = k;
  slot_ = &obj[k];
  key_ = std::move(k);
  return true;
}

bool Handler::end_object() {
  if (mode_ == Mode::kVocab) {
    mode_ = Mode::kDom;
    return true;
  }
  stack_.pop_back();
  frame_keys_.pop_back();
  return true;
}

bool Handler::start_array(std::size_t) {
  switch (mode_) {
    case Mode::kVocab: return Fail(VocabWhere().str(), ": expected a token id in [0, 2^30), found an array");
    case Mode::kMergePair: return BadMerge("an array holding an array");
    case Mode::kMerges:
      mode_ = Mode::kMergePair;
      pair_strings_ = 0;
      return true;
    case Mode::kDom: break;
  }
  if (AtModelKey("merges")) {
    Place(json::array());  // placeholder, as for the vocab
    out_->has_merges = true;
    mode_ = Mode::kMerges;
    return true;
  }
  return Open(json::value_t::array);
}

bool Handler::end_array() {
  if (mode_ == Mode::kMergePair) {
    if (pair_strings_ != 2) {
      return BadMerge("an array of " + std::to_string(pair_strings_) + " item" + (pair_strings_ == 1 ? "" : "s"));
    }
    mode_ = Mode::kMerges;
    return true;
  }
  if (mode_ == Mode::kMerges) {
    mode_ = Mode::kDom;
    return true;
  }
  stack_.pop_back();
  frame_keys_.pop_back();
  return true;
}

Status Handler::Finish() {
  if (!duplicate_.empty())
    return MakeErrorCode(ErrorCode::kCorruptInput, where_.file, ": duplicate key \"", duplicate_, "\"");
  json* model = out_->doc.is_object() && out_->doc.contains("model") ? &out_->doc["model"] : nullptr;
  if (model != nullptr && model->is_object()) {  // the placeholders out
    if (out_->has_vocab) model->erase("vocab");
    if (out_->has_merges) model->erase("merges");
  }
  return Status::Ok();
}

}  // namespace

Result<TokenizerJson> ParseTokenizerJson(const std::string& text, const std::string& file) {
  TokenizerJson out;
  // Real files spend 60-130 bytes of text per token on its vocab entry and its merges.
  out.vocab.Reserve(std::min<size_t>(text.size() / 64, size_t{1} << 22));
  Handler h(&out, file);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &h);
  } catch (const json::exception& e) {  // not expected from sax_parse; kept as ParseJsonText's error
    return MakeErrorCode(ErrorCode::kCorruptInput, file, ": not valid JSON (", PrintableBytes(e.what()), ")");
  }
  if (!ok) return h.error();
  NIBBLE_RETURN_IF_ERROR(h.Finish());
  return out;
}

}  // namespace nibble
