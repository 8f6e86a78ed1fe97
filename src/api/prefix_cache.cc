// Public API: PrefixCache, KV snapshots of finished requests reused by later ones.
#include <nibble/prefix_cache.h>

#include <algorithm>
#include <utility>

#include "base/result.h"

namespace nibble {

namespace {

// What an entry costs: its K/V rows (a context of exactly its positions holds no spare block),
// its ids and its logits.
int64_t EntryBytes(const Session& s) {
  return s.kv_bytes() + 4 * static_cast<int64_t>(s.tokens().size() + s.logits().size());
}

// Whether `held` starts with ids[0, n).
bool StartsWith(const std::vector<int32_t>& held, const std::vector<int32_t>& ids, int64_t n) {
  return static_cast<int64_t>(held.size()) >= n && std::equal(ids.begin(), ids.begin() + n, held.begin());
}

}  // namespace

PrefixCache::PrefixCache(const Model& model, int64_t max_bytes) : model_(&model), max_bytes_(std::max<int64_t>(max_bytes, 0)) {}

Result<PrefixCache::Hit> PrefixCache::Acquire(const std::vector<int32_t>& tokens, const SessionOptions& options) {
  if (tokens.empty()) return MakeError("PrefixCache::Acquire: no tokens (a request has at least one)");
  std::shared_ptr<const Session> best;
  int64_t best_len = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best_it = lru_.end();
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const int64_t k = it->snapshot->CommonPrefix(tokens);
      if (k > best_len) best_len = k, best_it = it;
    }
    if (best_it != lru_.end()) {
      lru_.splice(lru_.begin(), lru_, best_it);
      best = best_it->snapshot;
    }
  }
  Hit hit;
  if (best == nullptr) {
    NIBBLE_ASSIGN_OR_RETURN(hit.session, Session::Create(*model_, options));
    return hit;
  }
  NIBBLE_ASSIGN_OR_RETURN(hit.session, best->Fork(best_len, options));
  hit.cached_tokens = best_len;
  return hit;
}

Result<bool> PrefixCache::Insert(const Session& session, int64_t position) {
  if (&session.model() != model_) return MakeError("PrefixCache::Insert: the session runs another model than the cache");
  const int64_t n = position == -1 ? session.position() : position;
  if (n < 0 || n > session.position())
    return MakeError("PrefixCache::Insert: position ", position, " is outside [0, ", session.position(), "] (-1 = all)");
  if (n == 0) return MakeError("PrefixCache::Insert: nothing to store (the session holds no positions)");
  const std::vector<int32_t>& ids = session.tokens();
  const bool logits = n == session.position() && !session.logits().empty();
  auto covered = [&] {  // an entry holds these ids (and more, or logits too): it counts as used (mu_ held)
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (StartsWith(it->snapshot->tokens(), ids, n) &&
          (it->snapshot->position() > n || !logits || !it->snapshot->logits().empty())) {
        lru_.splice(lru_.begin(), lru_, it);
        return true;
      }
    return false;
  };
  const int64_t need = KvCacheBytes(*model_, n) + 4 * (n + (logits ? static_cast<int64_t>(session.logits().size()) : 0));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (need > max_bytes_ || covered()) return false;
  }
  SessionOptions o;
  o.context = n;
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Session> snap, session.Fork(n, o));
  // A token Generate left to run belongs to the inserted conversation, not to a later request.
  if (!snap->logits().empty()) NIBBLE_RETURN_IF_ERROR(snap->KeepCommonPrefix(snap->tokens()));
  Entry e{std::shared_ptr<const Session>(std::move(snap)), 0};
  e.bytes = EntryBytes(*e.snapshot);
  std::lock_guard<std::mutex> lock(mu_);
  if (covered()) return false;  // another thread stored it meanwhile
  for (auto it = lru_.begin(); it != lru_.end();) {  // entries the new one holds
    if (StartsWith(ids, it->snapshot->tokens(), static_cast<int64_t>(it->snapshot->tokens().size())) &&
        static_cast<int64_t>(it->snapshot->tokens().size()) <= n) {
      bytes_ -= it->bytes;
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  bytes_ += e.bytes;
  lru_.push_front(std::move(e));
  while (bytes_ > max_bytes_ && lru_.size() > 1) {
    bytes_ -= lru_.back().bytes;
    lru_.pop_back();
  }
  return true;
}

int64_t PrefixCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int64_t PrefixCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(lru_.size());
}

void PrefixCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  bytes_ = 0;
}

}  // namespace nibble
