#include "tokenizer/bpe_model.h"

#include <array>
#include <cstdio>
#include <queue>

#include "tokenizer/tokenizer.h"

namespace nibble {

using nlohmann::json;

namespace {

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

// model.merges (streamed) -> the merge table; every token a merge names must be in the vocab.
// Two passes, each prefetching a few merges ahead: the lookups of a 128k-token vocab and the
// inserts into a table of a few hundred thousand pairs are cache misses, independent across merges.
Status ResolveMerges(const RawMerges& merges, const TokenVocab& vocab, const JsonWhere& where, MergeTable* table) {
  constexpr size_t kAhead = 8;
  const size_t n = merges.entries.size();
  std::vector<std::array<uint64_t, 3>> hashes(std::min(n, kAhead));
  auto hash_of = [&](size_t r) {
    const RawMerges::Entry& e = merges.entries[r];
    std::array<uint64_t, 3> h{TokenVocab::Hash(merges.left(e)), TokenVocab::Hash(merges.right(e)), TokenVocab::Hash(merges.merged(e))};
    for (uint64_t x : h) vocab.Prefetch(x);
    return h;
  };
  for (size_t r = 0; r < hashes.size(); ++r) hashes[r] = hash_of(r);
  std::vector<std::array<int32_t, 3>> ids(n);
  for (size_t r = 0; r < n; ++r) {
    const std::array<uint64_t, 3> h = hashes[r % kAhead];
    if (r + kAhead < n) hashes[r % kAhead] = hash_of(r + kAhead);
    const RawMerges::Entry& e = merges.entries[r];
    const int32_t a = vocab.FindHashed(merges.left(e), h[0]), b = vocab.FindHashed(merges.right(e), h[1]);
    const int32_t ab = vocab.FindHashed(merges.merged(e), h[2]);
    if (a < 0 || b < 0 || ab < 0) {
      const std::string_view missing = a < 0 ? merges.left(e) : b < 0 ? merges.right(e) : merges.merged(e);
      return MakeError((where / "merges")[r].str(), ": ", merges.Json(e), ": ", a >= 0 && b >= 0 ? "merged " : "", "token \"",
                       missing, "\" is not in the vocab");
    }
    ids[r] = {a, b, ab};
  }
  table->Reserve(n);
  for (size_t r = 0; r < n; ++r) {
    if (r + kAhead < n) table->Prefetch(ids[r + kAhead][0], ids[r + kAhead][1]);
    table->Insert(ids[r][0], ids[r][1], static_cast<int32_t>(r), ids[r][2]);
  }
  return Status::Ok();
}

}  // namespace

void MergeTable::Reserve(size_t n) {
  size_t cap = 16;
  int bits = 4;
  while (cap < 2 * n) {
    cap *= 2;
    ++bits;
  }
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

void MergeTable::Insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if (2 * (size_ + 1) > slots_.size()) {  // keep the load <= 1/2
    std::vector<Slot> old = std::move(slots_);
    Reserve(std::max<size_t>(size_ + 1, old.size()));
    for (const Slot& s : old)
      if (s.key != kEmpty) Insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFFu), s.rank, s.merged);
  }
  const uint64_t key = Key(left, right);
  size_t i = Slot0(key);
  for (; slots_[i].key != kEmpty; i = (i + 1) & mask_)
    if (slots_[i].key == key) return;
  slots_[i] = {key, rank, merged};
  ++size_;
}

Result<BpeModel> BpeModel::Parse(TokenizerJson& t, const JsonWhere& where) {
  const json& j = t.doc.at("model");
  NIBBLE_ASSIGN_OR_RETURN(std::string type, JsonString(j, "type", where));
  if (type != "BPE")
    return MakeErrorCode(ErrorCode::kUnsupported, (where / "type").str(), ": model type \"", type,
                         "\" is not supported (only BPE; Unigram, WordPiece and WordLevel models are not)");
  NIBBLE_RETURN_IF_ERROR(CheckUnsupported(j, where));
  BpeModel m;
  if (!t.has_vocab) return MakeError((where / "vocab").str(), ": expected an object of token -> id");
  m.vocab_ = std::move(t.vocab);
  m.id_end_ = t.vocab_id_end;
  NIBBLE_ASSIGN_OR_RETURN(m.byte_fallback_, JsonBool(j, "byte_fallback", where, false));
  NIBBLE_ASSIGN_OR_RETURN(m.fuse_unk_, JsonBool(j, "fuse_unk", where, false));
  NIBBLE_ASSIGN_OR_RETURN(m.ignore_merges_, JsonBool(j, "ignore_merges", where, false));
  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    NIBBLE_ASSIGN_OR_RETURN(std::string unk, JsonString(j, "unk_token", where));
    m.unk_id_ = m.vocab_.Find(unk);
    if (m.unk_id_ < 0) return MakeError((where / "unk_token").str(), ": \"", unk, "\" is not in the vocab");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    m.byte_ids_[static_cast<size_t>(b)] = m.vocab_.Find(name);
  }
  if (!t.has_merges && j.contains("merges")) return MakeError((where / "merges").str(), ": expected an array");
  NIBBLE_RETURN_IF_ERROR(ResolveMerges(t.merges, m.vocab_, where, &m.merges_));
  t.merges = RawMerges();
  return m;
}

// Characters to symbols: the character's token, else its <0xXX> byte tokens (byte_fallback,
// when every byte has one), else unk (consecutive unks fused when fuse_unk).
bool BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* ids, std::vector<uint32_t>* lens) const {
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const int n = std::max(1, Utf8CharLength(word, i));
    const std::string_view ch = word.substr(i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
    if (const int32_t id = vocab_.Find(ch); id >= 0) {
      ids->push_back(id);
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
    if (const int32_t id = vocab_.Find(word); id >= 0) {
      out->push_back(id);
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
    if (const int32_t m = merges_.Find(id[static_cast<size_t>(pos)], id[static_cast<size_t>(nx)], &rank); m >= 0) heap.push({rank, pos, m});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const auto p = static_cast<size_t>(c.pos);
    const int nx = next[p];
    if (len[p] == 0 || nx < 0) continue;
    int32_t rank;
    if (merges_.Find(id[p], id[static_cast<size_t>(nx)], &rank) != c.new_id) continue;  // stale: a neighbour changed since it was pushed
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
