#include "tokenizer/tokenizer.h"

#include "io/file.h"
#include "io/json.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace nibble {

using nlohmann::json;

int Utf8CharLength(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned char c = p[i];
  if (c < 0x80) return 1;
  int len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
  else return 0;
  if (i + static_cast<size_t>(len) > n) return 0;
  for (int j = 1; j < len; ++j) {
    if ((p[i + j] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (p[i + j] & 0x3F);
  }
  constexpr uint32_t kMinCp[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinCp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

int64_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8CharLength(s, i);
    if (len == 0) return static_cast<int64_t>(i);
    i += static_cast<size_t>(len);
  }
  return -1;
}

std::string RepairUtf8(std::string_view s) {
  if (FirstInvalidUtf8(s) < 0) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8CharLength(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    }
  }
  return out;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir, TokenizerKind kind) {
  const std::string spm_path = JoinPath(dir, "tokenizer.model"), json_path = JoinPath(dir, "tokenizer.json");
  if (kind == TokenizerKind::kAuto) {
    if (!PathExists(spm_path) && !PathExists(json_path))
      return MakeErrorCode(ErrorCode::kNotFound, dir, ": no tokenizer.model and no tokenizer.json");
    kind = PathExists(spm_path) ? TokenizerKind::kSpm : TokenizerKind::kHf;
  }
  if (kind == TokenizerKind::kSpm) {
    if (!PathExists(spm_path)) return MakeErrorCode(ErrorCode::kNotFound, spm_path, ": not found (--tokenizer spm reads it)");
    NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> sp, SentencePieceTokenizer::Load(dir));
    return std::unique_ptr<Tokenizer>(std::move(sp));
  }
  if (!PathExists(json_path)) return MakeErrorCode(ErrorCode::kNotFound, json_path, ": not found (--tokenizer hf reads it)");
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> hf, HfTokenizer::Load(dir));
  return std::unique_ptr<Tokenizer>(std::move(hf));
}

Result<std::vector<int32_t>> Tokenizer::Encode(const std::string& text, bool add_special_tokens) const {
  int64_t bad = FirstInvalidUtf8(text);
  if (bad >= 0) return MakeError("input text is not valid UTF-8 (first invalid byte at offset ", bad, ")");
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeText(text));
  if (!add_special_tokens) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + 2);
  if (special_.add_bos) out.push_back(special_.bos_id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (special_.add_eos && !special_.eos_ids.empty()) out.push_back(special_.eos_ids[0]);
  return out;
}

namespace {

Status ReadTokenizerConfig(const std::string& path, SpecialTokens& st) {
  NIBBLE_ASSIGN_OR_RETURN(json tc, ReadJsonFile(path));
  if (!tc.is_object()) return MakeError(path, ": expected a JSON object");
  for (auto [key, field] : {std::pair{"add_bos_token", &st.add_bos}, std::pair{"add_eos_token", &st.add_eos}}) {
    auto it = tc.find(key);
    if (it == tc.end() || it->is_null()) continue;
    if (!it->is_boolean()) return MakeError(path, ": key \"", key, "\": expected true or false, found ", it->dump());
    *field = it->get<bool>();
  }
  return Status::Ok();
}

Status ReadModelConfigIds(const std::string& path, int32_t n, SpecialTokens& st) {
  NIBBLE_ASSIGN_OR_RETURN(json cfg, ReadJsonFile(path));
  auto valid = [&](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < n; };
  if (cfg.is_object() && cfg.contains("bos_token_id") && !cfg["bos_token_id"].is_null()) {
    if (!valid(cfg["bos_token_id"])) return MakeError(path, ": key \"bos_token_id\": expected a token id in [0, ", n, "), found ", cfg["bos_token_id"].dump());
    st.bos_id = cfg["bos_token_id"].get<int32_t>();
  }
  if (cfg.is_object() && cfg.contains("pad_token_id") && !cfg["pad_token_id"].is_null()) {
    if (!valid(cfg["pad_token_id"])) return MakeError(path, ": key \"pad_token_id\": expected a token id in [0, ", n, "), found ", cfg["pad_token_id"].dump());
    st.pad_id = cfg["pad_token_id"].get<int32_t>();
  }
  if (cfg.is_object() && cfg.contains("eos_token_id") && !cfg["eos_token_id"].is_null()) {
    const json& e = cfg["eos_token_id"];
    std::vector<json> ids = e.is_array() ? e.get<std::vector<json>>() : std::vector<json>{e};
    st.eos_ids.clear();
    for (const json& v : ids) {
      if (!valid(v)) return MakeError(path, ": key \"eos_token_id\": expected token id(s) in [0, ", n, "), found ", e.dump());
      st.eos_ids.push_back(v.get<int32_t>());
    }
  }
  return Status::Ok();
}

}  // namespace

Result<SpecialTokens> ReadSpecialTokens(const std::string& dir, int32_t vocab_size, SpecialTokens defaults) {
  SpecialTokens st = std::move(defaults);
  const std::string tc_path = JoinPath(dir, "tokenizer_config.json");
  if (PathExists(tc_path)) NIBBLE_RETURN_IF_ERROR(ReadTokenizerConfig(tc_path, st));
  const std::string cfg_path = JoinPath(dir, "config.json");
  if (PathExists(cfg_path)) NIBBLE_RETURN_IF_ERROR(ReadModelConfigIds(cfg_path, vocab_size, st));
  if (st.add_bos && st.bos_id < 0) return MakeError(dir, ": add_bos_token is true but the tokenizer has no BOS id");
  return st;
}

}  // namespace nibble
