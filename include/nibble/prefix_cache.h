// PrefixCache: KV snapshots of finished requests, keyed by their token ids, so that a later
// request starting with the same ids (a system prompt, an earlier chat turn, few-shot examples)
// prefills only the rest (llama-server's cache_prompt across slots, vLLM's automatic prefix
// caching; the count is OpenAI's usage.prompt_tokens_details.cached_tokens).
//
// A server request with it:
//   auto ids = PromptTokens(model, prompt);
//   auto hit = cache.Acquire(*ids, session_options);  // usage: cached_tokens = hit->cached_tokens
//   if (hit->cached_tokens < ids->size())
//     hit->session->Prefill(std::vector<int32_t>(ids->begin() + hit->cached_tokens, ids->end()));
//   ... Sample / Step, or Generate with an empty prompt (which samples from these logits; its
//   own cached_tokens then counts the rest just prefilled too) ...
//   cache.Insert(*hit->session);                      // after the request
//
// What is held: each entry is a Session forked from the inserted one (Session::Fork) with a
// context of exactly its positions: a plain copy of its K/V rows (KvBytes of those positions),
// its token ids and its last logits. Acquire forks again from the entry, copying the reused rows
// into a new session sized by the request's options. Memory: the sum of the entries' bytes()
// stays within max_bytes; Insert evicts the least recently used (inserted or acquired) entries
// to make room. An entry whose ids start another's is dropped (the longer one holds it).
// Lookup compares the request with every entry (entries × tokens steps; a budget holds few).
//
// Threads: every method may be called from several threads at once (one mutex guards the
// entries). The copies (Fork) run outside the lock: an entry is immutable once stored and stays
// alive while an Acquire copies from it, even if evicted meanwhile. The Model must outlive the
// cache and every session it returns.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include <nibble/error.h>
#include <nibble/model.h>
#include <nibble/session.h>

namespace nibble {

class PrefixCache {
 public:
  /// A cache over `model` holding at most `max_bytes` of entries (0 stores nothing).
  PrefixCache(const Model& model, int64_t max_bytes);

  struct Hit {
    std::unique_ptr<Session> session;  // holds tokens[0, cached_tokens), with the logits of its last
                                       // position when the entry ends there (always when all are cached)
    int64_t cached_tokens = 0;         // positions copied rather than computed (0: a fresh session)
  };
  /// A session (with `options`, as Session::Create takes them) holding the longest prefix of
  /// `tokens` an entry holds: Session::CommonPrefix, so at most tokens.size() - 1 positions unless
  /// an entry holds exactly `tokens` with its logits. A fresh session when no entry shares a
  /// first token. Errors: no tokens; the session's (Create's, Fork's: context, memory).
  Result<Hit> Acquire(const std::vector<int32_t>& tokens, const SessionOptions& options = SessionOptions());
  /// Stores a snapshot of `session`'s context (its first `position` positions, -1 = all),
  /// evicting least recently used entries to stay within max_bytes. Returns whether it was
  /// stored: false when the snapshot alone exceeds max_bytes or an entry already holds these ids
  /// and more (that entry counts as used). Errors: nothing to store (position 0), a session over
  /// another Model, position out of range, the snapshot's memory (Fork's).
  Result<bool> Insert(const Session& session, int64_t position = -1);

  /// Bytes the entries hold now, their number, and the budget.
  int64_t bytes() const;
  int64_t entries() const;
  int64_t max_bytes() const { return max_bytes_; }
  /// Drops every entry.
  void Clear();

 private:
  struct Entry {
    std::shared_ptr<const Session> snapshot;
    int64_t bytes = 0;
  };
  const Model* model_;
  int64_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  int64_t bytes_ = 0;
};

}  // namespace nibble
