#include "tokenizer/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>

#include "io/file.h"
#include "io/json.h"

namespace nibble {

using nlohmann::json;

namespace {

constexpr size_t kMaxCachedWord = 64;      // longer words (SentencePiece-style lines) are not cached
constexpr size_t kMaxCacheEntries = 1 << 16;

uint32_t DecodeCp(std::string_view s, size_t i, int len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (len == 1) return p[0];
  uint32_t cp = p[0] & (0xFFu >> (len + 1));
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[k] & 0x3Fu);
  return cp;
}

// Unicode White_Space (Rust's char::is_whitespace, which lstrip / rstrip use).
bool IsSpaceCp(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsWordCp(uint32_t c) {
  if (c == '_') return true;
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// The code point ending just before byte `i` (valid UTF-8).
uint32_t CpBefore(std::string_view s, size_t i, size_t* start) {
  size_t j = i - 1;
  while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
  *start = j;
  return DecodeCp(s, j, static_cast<int>(i - j));
}

}  // namespace

// ---- added tokens ----

void AddedTokenMatcher::Add(const std::string& content, int32_t index) {
  int32_t node = 0;
  for (char c : content) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      it = edges_.emplace(key, static_cast<int32_t>(terminal_.size())).first;
      terminal_.push_back(-1);
    }
    node = it->second;
  }
  terminal_[static_cast<size_t>(node)] = index;
  first_[static_cast<uint8_t>(content[0])] = true;
}

std::vector<AddedTokenMatcher::Piece> AddedTokenMatcher::Split(std::string_view text,
                                                               const std::vector<AddedToken>& tokens) const {
  std::vector<Piece> out;
  size_t done = 0;  // text before this is in `out`
  for (size_t i = 0; i < text.size(); ++i) {
    if (!first_[static_cast<uint8_t>(text[i])]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < text.size(); ++k) {
      auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[k]));
      if (it == edges_.end()) break;
      node = it->second;
      if (terminal_[static_cast<size_t>(node)] >= 0) {
        best = terminal_[static_cast<size_t>(node)];
        best_end = k + 1;
      }
    }
    if (best < 0) continue;
    const AddedToken& t = tokens[static_cast<size_t>(best)];
    size_t a = i, b = best_end, s;
    if (t.single_word) {
      const bool word_before = a > 0 && IsWordCp(CpBefore(text, a, &s));
      const int n = b < text.size() ? Utf8CharLength(text, b) : 0;
      const bool word_after = n > 0 && IsWordCp(DecodeCp(text, b, n));
      if (word_before || word_after) continue;
    }
    if (t.lstrip)
      while (a > done && IsSpaceCp(CpBefore(text, a, &s))) a = s;
    if (t.rstrip)
      for (int n; b < text.size() && (n = Utf8CharLength(text, b)) > 0 && IsSpaceCp(DecodeCp(text, b, n));) b += static_cast<size_t>(n);
    if (a > done) out.push_back({done, a, -1});
    out.push_back({a, b, best});
    done = b;
    i = b - 1;
  }
  if (done < text.size() || out.empty()) out.push_back({done, text.size(), -1});
  return out;
}

// ---- loading ----

struct HfTokenizer::Parts {
  std::string file;
  BpeModel model;
  HfNormalizer normalizer;
  HfPreTokenizer pre_tokenizer;
  HfDecoder decoder;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher, normalized_matcher;
};

namespace {

Result<std::vector<AddedToken>> ParseAddedTokens(const json& j, const JsonWhere& where, int64_t id_limit,
                                                 const std::string& limit_why) {
  std::vector<AddedToken> out;
  if (j.is_null()) return out;
  if (!j.is_array()) return MakeError(where.str(), ": expected an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const JsonWhere w = where[i];
    const json& t = j[i];
    AddedToken a;
    NIBBLE_ASSIGN_OR_RETURN(a.content, JsonString(t, "content", w));
    if (a.content.empty()) return MakeError((w / "content").str(), ": empty token");
    if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= id_limit)
      return MakeError((w / "id").str(), ": ", t.value("id", json()).dump(), " is out of range [0, ", id_limit, ") (",
                       limit_why, ")");
    a.id = t["id"].get<int32_t>();
    NIBBLE_ASSIGN_OR_RETURN(a.special, JsonBool(t, "special", w, false));
    NIBBLE_ASSIGN_OR_RETURN(a.lstrip, JsonBool(t, "lstrip", w, false));
    NIBBLE_ASSIGN_OR_RETURN(a.rstrip, JsonBool(t, "rstrip", w, false));
    NIBBLE_ASSIGN_OR_RETURN(a.single_word, JsonBool(t, "single_word", w, false));
    NIBBLE_ASSIGN_OR_RETURN(a.normalized, JsonBool(t, "normalized", w, !a.special));
    out.push_back(std::move(a));
  }
  return out;
}

// The special tokens a TemplateProcessing "single" template puts before and after $A.
Status ParseTemplate(const json& p, const JsonWhere& where, std::vector<int32_t>* before, std::vector<int32_t>* after) {
  const json& single = p.value("single", json());
  const json& specials = p.value("special_tokens", json::object());
  if (!single.is_array()) return MakeError((where / "single").str(), ": expected an array");
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonWhere w = (where / "single")[i];
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
      return MakeError(w.str(), ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, found ", item.dump().substr(0, 120));
    const json& name = item["SpecialToken"]["id"];
    if (!name.is_string() || !specials.contains(name.get<std::string>()))
      return MakeError(w.str(), ": special token ", name.dump(), " is not in ", (where / "special_tokens").path);
    const json& ids = specials[name.get<std::string>()].value("ids", json());
    if (!ids.is_array()) return MakeError((where / "special_tokens" / name.get<std::string>() / "ids").str(), ": expected an array");
    for (const json& id : ids) {
      if (!id.is_number_integer()) return MakeError((where / "special_tokens").str(), ": ids of ", name.dump(), " must be integers");
      (seen_a ? after : before)->push_back(id.get<int32_t>());
    }
  }
  if (before->size() > 1 || after->size() > 1)
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "single").str(), ": templates with more than one special "
                         "token before or after the text are not supported");
  return Status::Ok();
}

Status ParsePostProcessor(const json& p, const JsonWhere& where, std::vector<int32_t>* before, std::vector<int32_t>* after) {
  if (p.is_null()) return Status::Ok();
  NIBBLE_ASSIGN_OR_RETURN(std::string type, JsonString(p, "type", where));
  if (type == "ByteLevel") return Status::Ok();  // offsets only; ids unchanged
  if (type == "TemplateProcessing") return ParseTemplate(p, where, before, after);
  if (type == "Sequence") {
    const json& procs = p.value("processors", json());
    if (!procs.is_array()) return MakeError((where / "processors").str(), ": expected an array");
    for (size_t i = 0; i < procs.size(); ++i) NIBBLE_RETURN_IF_ERROR(ParsePostProcessor(procs[i], (where / "processors")[i], before, after));
    return Status::Ok();
  }
  return MakeErrorCode(ErrorCode::kUnsupported, (where / "type").str(), ": unsupported post-processor type \"", type,
                       "\" (supported: TemplateProcessing, ByteLevel, Sequence)");
}

// A tokenizer_config.json token entry ("<s>" or {"content": "<s>", ...}) -> its id, or -1.
int32_t ConfigTokenId(const json& cfg, const char* key, const TokenVocab& vocab, const std::vector<AddedToken>& added) {
  if (!cfg.is_object() || !cfg.contains(key)) return -1;
  const json& v = cfg[key];
  const json content = v.is_object() ? v.value("content", json()) : v;
  if (!content.is_string()) return -1;
  const std::string s = content.get<std::string>();
  for (const AddedToken& a : added)
    if (a.content == s) return a.id;
  return vocab.Find(s);
}

// config.json's vocab_size in `dir`, or 0 when there is none.
Result<int64_t> ConfigVocabSize(const std::string& dir) {
  const std::string path = JoinPath(dir, "config.json");
  if (dir.empty() || !PathExists(path)) return int64_t{0};
  NIBBLE_ASSIGN_OR_RETURN(json cfg, ReadJsonFile(path));
  if (!cfg.is_object() || !cfg.contains("vocab_size")) return int64_t{0};
  if (!cfg["vocab_size"].is_number_integer() || cfg["vocab_size"].get<int64_t>() <= 0)
    return MakeError(path, ": key \"vocab_size\": expected a positive integer, found ", cfg["vocab_size"].dump());
  return cfg["vocab_size"].get<int64_t>();
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Parts> parts, SpecialTokens special)
    : Tokenizer(std::move(special)), parts_(std::move(parts)) {
  const Parts& p = *parts_;
  int32_t n = p.model.id_end();
  for (const AddedToken& a : p.added) n = std::max(n, a.id + 1);
  id_to_token_.resize(static_cast<size_t>(n));
  added_kind_.assign(static_cast<size_t>(n), 0);
  p.model.vocab().ForEach([&](std::string_view tok, int32_t id) { id_to_token_[static_cast<size_t>(id)] = tok; });
  for (const AddedToken& a : p.added) {
    id_to_token_[static_cast<size_t>(a.id)] = a.content;
    added_kind_[static_cast<size_t>(a.id)] = a.special ? 2 : 1;
  }
}

HfTokenizer::~HfTokenizer() = default;

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& dir) {
  const std::string path = JoinPath(dir, "tokenizer.json");
  NIBBLE_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  NIBBLE_ASSIGN_OR_RETURN(TokenizerJson t, ParseTokenizerJson(text, path));
  return Build(t, path, dir);
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJsonText(const std::string& text, const std::string& file) {
  NIBBLE_ASSIGN_OR_RETURN(TokenizerJson t, ParseTokenizerJson(text, file));
  return Build(t, file, "");
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Build(TokenizerJson& t, const std::string& file, const std::string& dir) {
  const JsonWhere top{file, ""};
  const json& j = t.doc;
  if (!j.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": expected a JSON object (a tokenizer.json)");
  if (!j.contains("model")) return MakeErrorCode(ErrorCode::kCorruptInput, file, ": no \"model\" (not a tokenizer.json)");
  auto p = std::make_unique<Parts>();
  p->file = file;
  NIBBLE_ASSIGN_OR_RETURN(p->model, BpeModel::Parse(t, top / "model"));
  NIBBLE_ASSIGN_OR_RETURN(const int64_t config_vocab, ConfigVocabSize(dir));
  if (config_vocab > 0 && p->model.id_end() > config_vocab)
    return MakeErrorCode(ErrorCode::kCorruptInput, (top / "model" / "vocab").str(), ": ids up to ", p->model.id_end() - 1,
                         " but ", JoinPath(dir, "config.json"), " has vocab_size ", config_vocab);
  const json& added_json = j.value("added_tokens", json());
  const int64_t limit = config_vocab > 0 ? config_vocab
                                         : p->model.id_end() + static_cast<int64_t>(added_json.is_array() ? added_json.size() : 0);
  const std::string why = config_vocab > 0 ? "config.json vocab_size" : "the vocab plus the added tokens";
  NIBBLE_ASSIGN_OR_RETURN(p->added, ParseAddedTokens(added_json, top / "added_tokens", limit, why));
  for (size_t i = 0; i < p->added.size(); ++i)
    (p->added[i].normalized ? p->normalized_matcher : p->raw_matcher).Add(p->added[i].content, static_cast<int32_t>(i));
  NIBBLE_ASSIGN_OR_RETURN(p->normalizer, HfNormalizer::Parse(j.value("normalizer", json()), top / "normalizer"));
  NIBBLE_ASSIGN_OR_RETURN(p->pre_tokenizer, HfPreTokenizer::Parse(j.value("pre_tokenizer", json()), top / "pre_tokenizer"));
  NIBBLE_ASSIGN_OR_RETURN(p->decoder, HfDecoder::Parse(j.value("decoder", json()), top / "decoder"));
  std::vector<int32_t> before, after;
  NIBBLE_RETURN_IF_ERROR(ParsePostProcessor(j.value("post_processor", json()), top / "post_processor", &before, &after));
  SpecialTokens defaults;
  defaults.add_bos = !before.empty();
  defaults.add_eos = !after.empty();
  json cfg;
  if (!dir.empty() && PathExists(JoinPath(dir, "tokenizer_config.json"))) {
    NIBBLE_ASSIGN_OR_RETURN(cfg, ReadJsonFile(JoinPath(dir, "tokenizer_config.json")));
  }
  defaults.bos_id = !before.empty() ? before[0] : ConfigTokenId(cfg, "bos_token", p->model.vocab(), p->added);
  if (!after.empty()) defaults.eos_ids = {after[0]};
  else if (int32_t eos = ConfigTokenId(cfg, "eos_token", p->model.vocab(), p->added); eos >= 0) defaults.eos_ids = {eos};
  defaults.pad_id = ConfigTokenId(cfg, "pad_token", p->model.vocab(), p->added);
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer(std::move(p), SpecialTokens{}));
  for (int32_t id : {defaults.bos_id, defaults.eos_ids.empty() ? -1 : defaults.eos_ids[0]})
    if (id >= tok->vocab_size())
      return MakeError((top / "post_processor").str(), ": special token id ", id, " is out of range [0, ", tok->vocab_size(), ")");
  if (dir.empty()) {
    tok->set_special_tokens(defaults);
  } else {
    NIBBLE_ASSIGN_OR_RETURN(SpecialTokens st, ReadSpecialTokens(dir, tok->vocab_size(), std::move(defaults)));
    tok->set_special_tokens(std::move(st));
  }
  return tok;
}

// ---- encoding ----

bool HfTokenizer::EncodeWordCached(std::string_view word, std::vector<int32_t>* out) const {
  if (const int32_t id = parts_->model.WholeWordId(word); id >= 0) {  // most words, without the lock
    out->push_back(id);
    return true;
  }
  if (word.size() > kMaxCachedWord) return parts_->model.EncodeWord(word, out);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return true;
    }
  }
  const size_t before = out->size();
  if (!parts_->model.EncodeWord(word, out)) return false;
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::string(word), std::vector<int32_t>(out->begin() + static_cast<std::ptrdiff_t>(before), out->end()));
  return true;
}

// Normalized text between added tokens: pre-tokenize, then the model on each word.
bool HfTokenizer::EncodeSegment(const std::string& normalized, bool at_start, std::vector<int32_t>* out) const {
  return parts_->pre_tokenizer.Apply(normalized, at_start, [&](std::string_view w) { return EncodeWordCached(w, out); });
}

Result<std::vector<int32_t>> HfTokenizer::EncodeText(const std::string& text) const {
  const Parts& p = *parts_;
  std::vector<int32_t> out;
  for (const AddedTokenMatcher::Piece& raw : p.raw_matcher.Split(text, p.added)) {
    if (raw.token >= 0) {
      out.push_back(p.added[static_cast<size_t>(raw.token)].id);
      continue;
    }
    if (raw.end == raw.begin) continue;
    const std::string normalized = p.normalizer.Apply(text.substr(raw.begin, raw.end - raw.begin));
    for (const AddedTokenMatcher::Piece& np : p.normalized_matcher.Split(normalized, p.added)) {
      if (np.token >= 0) {
        out.push_back(p.added[static_cast<size_t>(np.token)].id);
      } else if (np.end > np.begin &&
                 !EncodeSegment(normalized.substr(np.begin, np.end - np.begin), raw.begin == 0 && np.begin == 0, &out)) {
        return MakeError(p.file, ": text has a character with no token, no byte fallback and no unk_token");
      }
    }
  }
  return out;
}

// ---- decoding ----

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || added_kind_[static_cast<size_t>(id)] == 2) continue;
    const std::string& t = id_to_token_[static_cast<size_t>(id)];
    if (!t.empty()) tokens.push_back(t);
  }
  return RepairUtf8(parts_->decoder.Apply(std::move(tokens)));
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && added_kind_[static_cast<size_t>(id)] == 2;
}

std::string HfTokenizer::Piece(int32_t id) const {
  return id >= 0 && id < vocab_size() ? id_to_token_[static_cast<size_t>(id)] : std::string();
}

}  // namespace nibble
