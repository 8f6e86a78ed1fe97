#include "tokenizer/hf_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>

#include "tokenizer/tokenizer.h"

namespace nibble {

using nlohmann::json;

namespace {

// The pattern ByteLevel splits with when use_regex is true (GPT-2's).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string TypeOf(const json& j, const JsonWhere& where, Result<std::string>* err) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    *err = MakeError(where.str(), ": expected an object with a string \"type\", found ", j.dump().substr(0, 120));
    return "";
  }
  return j["type"].get<std::string>();
}

// A "Sequence" component: every element of j[key] added in order through `add`, each named
// by its path for errors.
template <class Add>
Status AddSequence(const json& j, const JsonWhere& where, const char* key, Add add) {
  if (!j.contains(key) || !j[key].is_array()) return MakeError((where / key).str(), ": expected an array");
  for (size_t i = 0; i < j[key].size(); ++i) NIBBLE_RETURN_IF_ERROR(add(j[key][i], (where / key)[i]));
  return Status::Ok();
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's map: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 on.
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> bytes;
  ByteLevelTables() {
    bytes.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      AppendUtf8(cp, &chars[static_cast<size_t>(b)]);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables t;
  return t;
}

void ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos);
  s = std::move(out);
}

}  // namespace

Result<std::string> JsonString(const json& j, const std::string& key, const JsonWhere& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    return MakeError((where / key).str(), ": expected a string, found ",
                     j.is_object() && j.contains(key) ? j[key].dump().substr(0, 120) : "nothing");
  return j[key].get<std::string>();
}

Result<bool> JsonBool(const json& j, const std::string& key, const JsonWhere& where, bool fallback) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) return MakeError((where / key).str(), ": expected true or false, found ", j[key].dump());
  return j[key].get<bool>();
}

// ---- regex ----

Result<std::shared_ptr<const HfRegex>> HfRegex::Compile(const std::string& pattern, const JsonWhere& where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return MakeError(where.str(), ": invalid regex ", json(pattern).dump(), " at offset ", offset, ": ",
                     reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // interpreted when JIT is unavailable
  return std::shared_ptr<const HfRegex>(new HfRegex(code));
}

HfRegex::~HfRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool HfRegex::ForEachMatch(std::string_view s, const MatchFn& fn) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  bool ok = true;
  size_t pos = 0;
  while (ok && pos <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      ok = fn(ov[0], ov[1]);
      pos = ov[1];
    } else {  // an empty match: step over one character
      if (ov[0] >= s.size()) break;
      const int len = Utf8CharLength(s, ov[0]);
      pos = ov[0] + static_cast<size_t>(len > 0 ? len : 1);
    }
  }
  pcre2_match_data_free(md);
  return ok;
}

Result<HfPattern> HfPattern::Parse(const json& j, const JsonWhere& where) {
  HfPattern p;
  if (j.is_object() && j.size() == 1 && j.contains("String") && j["String"].is_string()) {
    p.literal = j["String"].get<std::string>();
    if (p.literal.empty()) return MakeError((where / "String").str(), ": empty pattern");
    return p;
  }
  if (j.is_object() && j.size() == 1 && j.contains("Regex") && j["Regex"].is_string()) {
    NIBBLE_ASSIGN_OR_RETURN(p.regex, HfRegex::Compile(j["Regex"].get<std::string>(), where / "Regex"));
    return p;
  }
  return MakeError(where.str(), ": expected {\"String\": ...} or {\"Regex\": ...}, found ", j.dump().substr(0, 120));
}

bool HfPattern::ForEachMatch(std::string_view s, const HfRegex::MatchFn& fn) const {
  if (regex) return regex->ForEachMatch(s, fn);
  for (size_t hit, pos = 0; (hit = s.find(literal, pos)) != std::string_view::npos; pos = hit + literal.size())
    if (!fn(hit, hit + literal.size())) return false;
  return true;
}

const std::string& ByteLevelChar(uint8_t b) { return Tables().chars[b]; }

int ByteLevelByte(uint32_t cp) { return cp < 512 ? Tables().bytes[cp] : -1; }

// ---- normalizers ----

Result<HfNormalizer> HfNormalizer::Parse(const json& j, const JsonWhere& where) {
  HfNormalizer n;
  if (!j.is_null()) NIBBLE_RETURN_IF_ERROR(n.Add(j, where));
  return n;
}

Status HfNormalizer::Add(const json& j, const JsonWhere& where) {
  Result<std::string> err = std::string();
  const std::string type = TypeOf(j, where, &err);
  if (!err.ok()) return err.error();
  if (type == "Sequence")
    return AddSequence(j, where, "normalizers", [this](const json& e, const JsonWhere& w) { return Add(e, w); });
  NormalizerStep st{NormalizerStep::kNfc, "", {}};
  if (type == "NFC") {
    st.kind = NormalizerStep::kNfc;
  } else if (type == "Prepend") {
    st.kind = NormalizerStep::kPrepend;
    NIBBLE_ASSIGN_OR_RETURN(st.text, JsonString(j, "prepend", where));
  } else if (type == "Replace") {
    st.kind = NormalizerStep::kReplace;
    NIBBLE_ASSIGN_OR_RETURN(st.text, JsonString(j, "content", where));
    NIBBLE_ASSIGN_OR_RETURN(st.pattern, HfPattern::Parse(j.value("pattern", json()), where / "pattern"));
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "type").str(), ": unsupported normalizer type \"", type,
                         "\" (supported: NFC, Prepend, Replace, Sequence)");
  }
  steps_.push_back(std::move(st));
  return Status::Ok();
}

std::string HfNormalizer::Apply(std::string s) const {
  for (const NormalizerStep& st : steps_) {
    switch (st.kind) {
      case NormalizerStep::kNfc: {
        bool ascii = true;
        for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
        if (ascii) break;
        utf8proc_uint8_t* dst = nullptr;
        const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                    &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (n >= 0) s.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
        std::free(dst);
        break;
      }
      case NormalizerStep::kPrepend:
        if (!s.empty()) s = st.text + s;
        break;
      case NormalizerStep::kReplace: {
        if (!st.pattern.regex) {
          ReplaceAll(s, st.pattern.literal, st.text);
          break;
        }
        std::string out;
        size_t pos = 0;
        st.pattern.ForEachMatch(s, [&](size_t a, size_t b) {
          out.append(s, pos, a - pos);
          out += st.text;
          pos = b;
          return true;
        });
        out.append(s, pos);
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

// ---- pre-tokenizers ----

namespace {

Result<SplitBehavior> ParseBehavior(const json& j, const JsonWhere& where) {
  NIBBLE_ASSIGN_OR_RETURN(std::string b, JsonString(j, "behavior", where));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return MakeError((where / "behavior").str(), ": unknown split behavior \"", b,
                   "\" (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

struct Span {
  size_t a, b;
  bool delim;
};

// Joins the spans of a split (delimiters and the text between them, in order, as they are
// found) into parts as `behavior` says and passes each non-empty part to `emit(part, index)`.
// Streaming, so splitting a long text holds no list of its pieces.
template <typename Emit>
class SpanJoiner {
 public:
  SpanJoiner(std::string_view s, SplitBehavior behavior, Emit& emit) : s_(s), behavior_(behavior), emit_(emit) {}
  bool Push(Span sp) {
    bool ok = true;
    switch (behavior_) {
      case SplitBehavior::kRemoved: ok = sp.delim || Out(sp); break;
      case SplitBehavior::kIsolated: ok = Out(sp); break;
      case SplitBehavior::kMergedWithPrevious:
      case SplitBehavior::kContiguous: {
        const bool merge = behavior_ == SplitBehavior::kContiguous ? sp.delim == prev_delim_ : sp.delim && !prev_delim_;
        if (merge && held_) {
          cur_.b = sp.b;
        } else {
          if (held_) ok = Out(cur_);
          cur_ = sp;
          held_ = true;
        }
        break;
      }
      case SplitBehavior::kMergedWithNext:  // a delimiter followed by a non-delimiter starts that part
        if (sp.delim) {
          if (held_) ok = Out(cur_);
          cur_ = sp;
          held_ = true;
        } else {
          ok = Out({held_ ? cur_.a : sp.a, sp.b, false});
          held_ = false;
        }
        break;
    }
    prev_delim_ = sp.delim;
    return ok;
  }
  bool Finish() { return !held_ || Out(cur_); }

 private:
  bool Out(const Span& p) { return p.b <= p.a || emit_(s_.substr(p.a, p.b - p.a), index_++); }
  std::string_view s_;
  SplitBehavior behavior_;
  Emit& emit_;
  Span cur_{0, 0, false};
  bool held_ = false, prev_delim_ = false;
  size_t index_ = 0;
};

// Cuts `s` at the matches of `pattern` (the delimiters; with invert, the text between them) and
// emits the parts as SpanJoiner does; stops when emit returns false.
template <typename Emit>
bool SplitBy(std::string_view s, const HfPattern& pattern, SplitBehavior behavior, bool invert, Emit&& emit) {
  SpanJoiner<Emit> joiner(s, behavior, emit);
  size_t pos = 0;
  const bool ok = pattern.ForEachMatch(s, [&](size_t a, size_t b) {
    if (a > pos && !joiner.Push({pos, a, invert})) return false;
    pos = b;
    return joiner.Push({a, b, !invert});
  });
  if (!ok) return false;
  if (pos < s.size() && !joiner.Push({pos, s.size(), invert})) return false;
  return joiner.Finish();
}

std::string ByteLevelMap(std::string_view s) {
  std::string mapped;
  mapped.reserve(s.size() * 2);
  for (char c : s) mapped += ByteLevelChar(static_cast<uint8_t>(c));
  return mapped;
}

}  // namespace

Result<HfPreTokenizer> HfPreTokenizer::Parse(const json& j, const JsonWhere& where) {
  HfPreTokenizer p;
  if (!j.is_null()) NIBBLE_RETURN_IF_ERROR(p.Add(j, where));
  return p;
}

Status HfPreTokenizer::Add(const json& j, const JsonWhere& where) {
  Result<std::string> err = std::string();
  const std::string type = TypeOf(j, where, &err);
  if (!err.ok()) return err.error();
  if (type == "Sequence")
    return AddSequence(j, where, "pretokenizers", [this](const json& e, const JsonWhere& w) { return Add(e, w); });
  PreTokenizerStep st{};
  if (type == "Split") {
    st.kind = PreTokenizerStep::kSplit;
    NIBBLE_ASSIGN_OR_RETURN(st.pattern, HfPattern::Parse(j.value("pattern", json()), where / "pattern"));
    NIBBLE_ASSIGN_OR_RETURN(st.behavior, ParseBehavior(j, where));
    NIBBLE_ASSIGN_OR_RETURN(st.invert, JsonBool(j, "invert", where, false));
  } else if (type == "ByteLevel") {
    st.kind = PreTokenizerStep::kByteLevel;
    NIBBLE_ASSIGN_OR_RETURN(st.add_prefix_space, JsonBool(j, "add_prefix_space", where, true));
    NIBBLE_ASSIGN_OR_RETURN(st.use_regex, JsonBool(j, "use_regex", where, true));
    if (st.use_regex) {
      NIBBLE_ASSIGN_OR_RETURN(st.pattern.regex, HfRegex::Compile(kGpt2Pattern, where));
    }
  } else if (type == "Metaspace") {
    st.kind = PreTokenizerStep::kMetaspace;
    NIBBLE_ASSIGN_OR_RETURN(st.replacement, JsonString(j, "replacement", where));
    NIBBLE_ASSIGN_OR_RETURN(st.split, JsonBool(j, "split", where, true));
    const std::string scheme = j.value("prepend_scheme", std::string("always"));
    st.prepend_scheme = scheme == "first" ? 1 : scheme == "never" ? 2 : 0;
    if (!j.contains("prepend_scheme") && j.contains("add_prefix_space") && j["add_prefix_space"] == false)
      st.prepend_scheme = 2;
  } else if (type == "Digits") {
    st.kind = PreTokenizerStep::kDigits;
    NIBBLE_ASSIGN_OR_RETURN(st.individual_digits, JsonBool(j, "individual_digits", where, false));
    NIBBLE_ASSIGN_OR_RETURN(st.pattern.regex, HfRegex::Compile(R"(\p{N})", where));
    st.behavior = st.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "type").str(), ": unsupported pre-tokenizer type \"", type,
                         "\" (supported: ByteLevel, Split, Metaspace, Digits, Sequence)");
  }
  steps_.push_back(std::move(st));
  return Status::Ok();
}

// Runs steps_[step..] on `word` depth first, so no step holds more than one word's pieces.
bool HfPreTokenizer::Run(size_t step, std::string_view word, bool first_word, const WordSink& sink) const {
  if (step == steps_.size()) return word.empty() || sink(word);
  const PreTokenizerStep& st = steps_[step];
  auto next = [&](std::string_view piece, size_t index) { return Run(step + 1, piece, first_word && index == 0, sink); };
  switch (st.kind) {
    case PreTokenizerStep::kSplit:
    case PreTokenizerStep::kDigits:
      return SplitBy(word, st.pattern, st.behavior, st.invert, next);
    case PreTokenizerStep::kByteLevel: {
      std::string w(word);
      if (st.add_prefix_space && !w.starts_with(' ')) w.insert(0, 1, ' ');
      if (!st.use_regex) return Run(step + 1, ByteLevelMap(w), first_word, sink);
      return SplitBy(w, st.pattern, SplitBehavior::kIsolated, false,
                     [&](std::string_view piece, size_t index) { return next(ByteLevelMap(piece), index); });
    }
    case PreTokenizerStep::kMetaspace: {
      std::string w(word);
      ReplaceAll(w, " ", st.replacement);
      if (!w.starts_with(st.replacement) && (st.prepend_scheme == 0 || (st.prepend_scheme == 1 && first_word)))
        w.insert(0, st.replacement);
      if (!st.split) return Run(step + 1, w, first_word, sink);
      return SplitBy(w, HfPattern{st.replacement, nullptr}, SplitBehavior::kMergedWithNext, false, next);
    }
  }
  return true;
}

bool HfPreTokenizer::Apply(std::string_view text, bool at_start, const WordSink& sink) const {
  return Run(0, text, at_start, sink);
}

// ---- decoders ----

Result<HfDecoder> HfDecoder::Parse(const json& j, const JsonWhere& where) {
  HfDecoder d;
  if (!j.is_null()) NIBBLE_RETURN_IF_ERROR(d.Add(j, where));
  return d;
}

Status HfDecoder::Add(const json& j, const JsonWhere& where) {
  Result<std::string> err = std::string();
  const std::string type = TypeOf(j, where, &err);
  if (!err.ok()) return err.error();
  if (type == "Sequence")
    return AddSequence(j, where, "decoders", [this](const json& e, const JsonWhere& w) { return Add(e, w); });
  DecoderStep st{};
  if (type == "ByteLevel") {
    st.kind = DecoderStep::kByteLevel;
  } else if (type == "Replace") {
    st.kind = DecoderStep::kReplace;
    NIBBLE_ASSIGN_OR_RETURN(HfPattern p, HfPattern::Parse(j.value("pattern", json()), where / "pattern"));
    if (p.regex) return MakeErrorCode(ErrorCode::kUnsupported, (where / "pattern").str(), ": a Regex pattern in a Replace decoder is not supported");
    st.from = p.literal;
    NIBBLE_ASSIGN_OR_RETURN(st.to, JsonString(j, "content", where));
  } else if (type == "ByteFallback") {
    st.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    st.kind = DecoderStep::kFuse;
  } else if (type == "Strip") {
    st.kind = DecoderStep::kStrip;
    NIBBLE_ASSIGN_OR_RETURN(st.strip_content, JsonString(j, "content", where));
    if (!j.value("start", json(0)).is_number_unsigned() || !j.value("stop", json(0)).is_number_unsigned())
      return MakeError(where.str(), ": Strip: start and stop must be non-negative integers");
    st.start = j.value("start", 0);
    st.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    st.kind = DecoderStep::kMetaspace;
    NIBBLE_ASSIGN_OR_RETURN(st.from, JsonString(j, "replacement", where));
    st.prepend = j.value("prepend_scheme", std::string("always")) != "never" && j.value("add_prefix_space", true);
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "type").str(), ": unsupported decoder type \"", type,
                         "\" (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
  }
  steps_.push_back(std::move(st));
  return Status::Ok();
}

namespace {

// "<0xAB>" -> 0xAB, else -1.
int ByteToken(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[static_cast<size_t>(i)];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string ByteLevelDecode(const std::vector<std::string>& tokens) {
  std::string out;
  for (const std::string& t : tokens) {
    std::string bytes;
    bool all = true;
    for (size_t i = 0; i < t.size() && all;) {
      const int len = Utf8CharLength(t, i);
      uint32_t cp = 0;
      if (len == 1) cp = static_cast<unsigned char>(t[i]);
      else if (len == 2) cp = ((t[i] & 0x1Fu) << 6) | (t[i + 1] & 0x3Fu);
      const int b = len == 1 || len == 2 ? ByteLevelByte(cp) : -1;
      all = b >= 0;
      bytes.push_back(static_cast<char>(b));
      i += static_cast<size_t>(len > 0 ? len : 1);
    }
    out += all ? bytes : t;
  }
  return out;
}

void StripToken(std::string& t, const std::string& c, int start, int stop) {
  for (int i = 0; i < start && !c.empty() && t.starts_with(c); ++i) t.erase(0, c.size());
  for (int i = 0; i < stop && !c.empty() && t.ends_with(c); ++i) t.erase(t.size() - c.size());
}

}  // namespace

std::string HfDecoder::Apply(std::vector<std::string> tokens) const {
  for (const DecoderStep& st : steps_) {
    switch (st.kind) {
      case DecoderStep::kByteLevel: tokens = {ByteLevelDecode(tokens)}; break;
      case DecoderStep::kReplace:
        for (std::string& t : tokens) ReplaceAll(t, st.from, st.to);
        break;
      case DecoderStep::kByteFallback:
        // Raw bytes here; the caller repairs what does not form UTF-8 (one U+FFFD per byte).
        for (std::string& t : tokens)
          if (const int b = ByteToken(t); b >= 0) t = std::string(1, static_cast<char>(b));
        break;
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {std::move(all)};
        break;
      }
      case DecoderStep::kStrip:
        for (std::string& t : tokens) StripToken(t, st.strip_content, st.start, st.stop);
        break;
      case DecoderStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          ReplaceAll(tokens[i], st.from, " ");
          if (i == 0 && st.prepend && tokens[i].starts_with(' ')) tokens[i].erase(0, 1);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace nibble
