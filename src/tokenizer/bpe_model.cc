#include "tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "tokenizer/tokenizer.h"

namespace nibble {

using nlohmann::json;

namespace {

uint64_t PairKey(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

// A merge is "a b" (the split is at the one space; neither side may contain one) or ["a", "b"].
Result<std::pair<std::string, std::string>> MergeParts(const json& m, const JsonWhere& where) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return std::pair{m[0].get<std::string>(), m[1].get<std::string>()};
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ');
    if (sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos)
      return std::pair{s.substr(0, sp), s.substr(sp + 1)};
  }
  return MakeError(where.str(), ": expected a merge \"a b\" or [\"a\", \"b\"], found ", m.dump().substr(0, 120));
}

Status CheckUnsupported(const json& j, const JsonWhere& where) {
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_string() && j[key].get<std::string>().empty()))
      return MakeErrorCode(ErrorCode::kUnsupported, (where / key).str(), ": ", j[key].dump(), " is not supported");
  }
  if (j.contains("dropout") && !j["dropout"].is_null() && !(j["dropout"].is_number() && j["dropout"].get<double>() == 0.0))
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "dropout").str(), ": BPE dropout ", j["dropout"].dump(),
                         " is not supported");
  return Status::Ok();
}

Status ParseVocab(const json& v, const JsonWhere& where, TokenMap* vocab, int32_t* id_end) {
  if (!v.is_object()) return MakeError(where.str(), ": expected an object of token -> id");
  vocab->reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    const json& id = it.value();
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 30))
      return MakeError((where / json(it.key()).dump()).str(), ": expected a token id in [0, 2^30), found ", id.dump());
    const auto i = id.get<int32_t>();
    vocab->emplace(it.key(), i);
    *id_end = std::max(*id_end, i + 1);
  }
  return Status::Ok();
}

}  // namespace

Result<BpeModel> BpeModel::Parse(const json& j, const JsonWhere& where) {
  NIBBLE_ASSIGN_OR_RETURN(std::string type, JsonString(j, "type", where));
  if (type != "BPE")
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "type").str(), ": model type \"", type,
                         "\" is not supported (only BPE; Unigram, WordPiece and WordLevel models are not)");
  NIBBLE_RETURN_IF_ERROR(CheckUnsupported(j, where));
  BpeModel m;
  NIBBLE_RETURN_IF_ERROR(ParseVocab(j.value("vocab", json()), where / "vocab", &m.vocab_, &m.id_end_));
  NIBBLE_ASSIGN_OR_RETURN(m.byte_fallback_, JsonBool(j, "byte_fallback", where, false));
  NIBBLE_ASSIGN_OR_RETURN(m.fuse_unk_, JsonBool(j, "fuse_unk", where, false));
  NIBBLE_ASSIGN_OR_RETURN(m.ignore_merges_, JsonBool(j, "ignore_merges", where, false));
  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    NIBBLE_ASSIGN_OR_RETURN(std::string unk, JsonString(j, "unk_token", where));
    auto it = m.vocab_.find(unk);
    if (it == m.vocab_.end()) return MakeError((where / "unk_token").str(), ": \"", unk, "\" is not in the vocab");
    m.unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = m.vocab_.find(std::string_view(name));
    m.byte_ids_[static_cast<size_t>(b)] = it != m.vocab_.end() ? it->second : -1;
  }
  const json& merges = j.value("merges", json::array());
  if (!merges.is_array()) return MakeError((where / "merges").str(), ": expected an array");
  m.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const JsonWhere mw = (where / "merges")[r];
    NIBBLE_ASSIGN_OR_RETURN(auto parts, MergeParts(merges[r], mw));
    const auto a = m.vocab_.find(parts.first), b = m.vocab_.find(parts.second);
    const auto ab = m.vocab_.find(parts.first + parts.second);
    for (auto [it, tok] : {std::pair{a, &parts.first}, std::pair{b, &parts.second}})
      if (it == m.vocab_.end()) return MakeError(mw.str(), ": ", merges[r].dump(), ": token \"", *tok, "\" is not in the vocab");
    if (ab == m.vocab_.end())
      return MakeError(mw.str(), ": ", merges[r].dump(), ": merged token \"", parts.first + parts.second, "\" is not in the vocab");
    m.merges_.emplace(PairKey(a->second, b->second), std::pair{static_cast<int32_t>(r), ab->second});  // first rank wins
  }
  return m;
}

const int32_t* BpeModel::Merge(int32_t a, int32_t b, int32_t* rank) const {
  auto it = merges_.find(PairKey(a, b));
  if (it == merges_.end()) return nullptr;
  *rank = it->second.first;
  return &it->second.second;
}

// Characters to symbols: the character's token, else its <0xXX> byte tokens (byte_fallback,
// when every byte has one), else unk (consecutive unks fused when fuse_unk).
bool BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* ids, std::vector<uint32_t>* lens) const {
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const int n = std::max(1, Utf8CharLength(word, i));
    const std::string_view ch = word.substr(i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      ids->push_back(it->second);
      lens->push_back(static_cast<uint32_t>(n));
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) {
          ids->push_back(byte_ids_[static_cast<uint8_t>(c)]);
          lens->push_back(1);
        }
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ < 0) return false;
    if (fuse_unk_ && last_unk) {
      lens->back() += static_cast<uint32_t>(n);
    } else {
      ids->push_back(unk_id_);
      lens->push_back(static_cast<uint32_t>(n));
    }
    last_unk = true;
  }
  return true;
}

bool BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out->push_back(it->second);
      return true;
    }
  }
  std::vector<int32_t> id;
  std::vector<uint32_t> len;
  if (!InitialSymbols(word, &id, &len)) return false;
  const int n = static_cast<int>(id.size());
  // Symbols form a doubly linked list; a merged-away symbol gets len 0.
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int pos) {
    if (pos < 0) return;
    const int nx = next[static_cast<size_t>(pos)];
    if (nx < 0) return;
    int32_t rank;
    if (const int32_t* m = Merge(id[static_cast<size_t>(pos)], id[static_cast<size_t>(nx)], &rank)) heap.push({rank, pos, *m});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const auto p = static_cast<size_t>(c.pos);
    const int nx = next[p];
    if (len[p] == 0 || nx < 0) continue;
    int32_t rank;
    const int32_t* m = Merge(id[p], id[static_cast<size_t>(nx)], &rank);
    if (m == nullptr || *m != c.new_id) continue;  // stale: a neighbour changed since it was pushed
    id[p] = c.new_id;
    len[p] += len[static_cast<size_t>(nx)];
    len[static_cast<size_t>(nx)] = 0;
    next[p] = next[static_cast<size_t>(nx)];
    if (next[p] >= 0) prev[static_cast<size_t>(next[p])] = c.pos;
    push(prev[p]);
    push(c.pos);
  }
  for (int i = 0; i >= 0 && n > 0; i = next[static_cast<size_t>(i)]) out->push_back(id[static_cast<size_t>(i)]);
  return true;
}

}  // namespace nibble
