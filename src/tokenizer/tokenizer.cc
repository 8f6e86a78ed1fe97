#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include "io/file.h"
#include "io/json.h"

namespace nibble {

using nlohmann::json;

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::~Tokenizer() = default;

int64_t FirstInvalidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  const std::string path = JoinPath(dir, "tokenizer.model");
  if (!PathExists(path)) {
    if (PathExists(JoinPath(dir, "tokenizer.json")))
      return MakeError(dir, ": only tokenizer.json found; this version reads SentencePiece tokenizer.model files");
    return MakeError(dir, ": no tokenizer.model found");
  }
  NIBBLE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  auto st = tok->sp_->LoadFromSerializedProto(bytes);
  if (!st.ok()) return MakeError(path, ": not a SentencePiece model (", st.ToString(), ")");
  if (tok->sp_->GetPieceSize() <= 0) return MakeError(path, ": SentencePiece model has no pieces");
  tok->bos_id_ = tok->sp_->bos_id();
  if (tok->sp_->eos_id() >= 0) tok->eos_ids_ = {tok->sp_->eos_id()};

  const std::string tc_path = JoinPath(dir, "tokenizer_config.json");
  if (PathExists(tc_path)) {
    NIBBLE_ASSIGN_OR_RETURN(json tc, ReadJsonFile(tc_path));
    if (!tc.is_object()) return MakeError(tc_path, ": expected a JSON object");
    for (auto [key, field] : {std::pair{"add_bos_token", &tok->add_bos_}, std::pair{"add_eos_token", &tok->add_eos_}}) {
      auto it = tc.find(key);
      if (it == tc.end() || it->is_null()) continue;
      if (!it->is_boolean()) return MakeError(tc_path, ": key \"", key, "\": expected true or false, found ", it->dump());
      *field = it->get<bool>();
    }
  }
  const std::string cfg_path = JoinPath(dir, "config.json");
  if (PathExists(cfg_path)) {
    NIBBLE_ASSIGN_OR_RETURN(json cfg, ReadJsonFile(cfg_path));
    const int32_t n = tok->sp_->GetPieceSize();
    auto valid = [&](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < n; };
    if (cfg.is_object() && cfg.contains("bos_token_id") && !cfg["bos_token_id"].is_null()) {
      if (!valid(cfg["bos_token_id"])) return MakeError(cfg_path, ": key \"bos_token_id\": expected a token id in [0, ", n, "), found ", cfg["bos_token_id"].dump());
      tok->bos_id_ = cfg["bos_token_id"].get<int32_t>();
    }
    if (cfg.is_object() && cfg.contains("eos_token_id") && !cfg["eos_token_id"].is_null()) {
      const json& e = cfg["eos_token_id"];
      std::vector<json> ids = e.is_array() ? e.get<std::vector<json>>() : std::vector<json>{e};
      tok->eos_ids_.clear();
      for (const json& v : ids) {
        if (!valid(v)) return MakeError(cfg_path, ": key \"eos_token_id\": expected token id(s) in [0, ", n, "), found ", e.dump());
        tok->eos_ids_.push_back(v.get<int32_t>());
      }
    }
  }
  if (tok->add_bos_ && tok->bos_id_ < 0) return MakeError(dir, ": add_bos_token is true but the tokenizer has no BOS id");
  return tok;
}

Result<std::vector<int32_t>> Tokenizer::Encode(const std::string& text) const {
  int64_t bad = FirstInvalidUtf8(text);
  if (bad >= 0) return MakeError("input text is not valid UTF-8 (first invalid byte at offset ", bad, ")");
  std::vector<int> ids;
  auto st = sp_->Encode(text, &ids);
  if (!st.ok()) return MakeError("tokenizer: ", st.ToString());
  std::vector<int32_t> out;
  out.reserve(ids.size() + 2);
  if (add_bos_) out.push_back(bos_id_);
  out.insert(out.end(), ids.begin(), ids.end());
  if (add_eos_ && !eos_ids_.empty()) out.push_back(eos_ids_[0]);
  return out;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  std::string out;
  sp_->Decode(v, &out);  // control ids (BOS/EOS) decode to nothing
  return out;
}

int32_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

}  // namespace nibble
