// An OpenAI-compatible HTTP server over a loaded Model (`nibble serve`): /v1/completions,
// /v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics. One scheduler
// thread runs every open request in one batched step (StepBatch: the running sequences' decode
// tokens plus at most `chunk` prompt tokens of the ones still prefilling), reuses KV across
// requests with a PrefixCache, and frees a sequence's slot when its client goes away. The
// request and response shapes, fields honoured and differences from OpenAI: docs/SERVER.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nibble/error.h>
#include <nibble/model.h>

namespace nibble {

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;             // 0 = any free port (Server::port() says which)
  int parallel = 8;            // sequences decoded together (slots)
  int64_t ctx_size = 4096;     // KV positions of each sequence (0 = DefaultContextSize)
  int64_t chunk = 256;         // prompt tokens per step across the prefilling sequences
  int64_t max_queue = 64;      // sequences that may wait for a slot; a request that would exceed it gets 429
  std::string api_key;         // "" = no key required
  int threads = 0;             // compute threads of the scheduler (0 = all cores)
  int64_t max_memory = 0;      // bytes the KV caches of all slots may take (SessionOptions::max_memory:
                               // 0 = DefaultMaxMemory(), < 0 = no limit)
  LoadOptions load;            // activations, kv_dtype, tokenizer, weight cache
  std::string chat_template;   // a Jinja file instead of the model's own chat_template ("" = the model's)
  std::string alias;           // the model id /v1/models reports ("" = the directory's name)
  double timeout_seconds = 600;  // a request running longer is ended (its stream with an error chunk)
  int64_t max_body_bytes = 8 << 20;  // larger request bodies get 413
  int64_t prefix_cache_bytes = 256 << 20;  // PrefixCache budget
};

/// Model-free checks of ServeOptions (ranges of parallel, ctx_size, chunk, max_queue, port,
/// timeout), naming the flag ("--parallel must be >= 1, got 0").
Status ValidateServeOptions(const ServeOptions& options);

class Server {
 public:
  /// Binds host:port and starts answering (/health says 503 until the model is loaded), then
  /// loads the model on the calling thread. Errors: the bind (names host and port), the load,
  /// the KV caches of all slots (ctx_size · parallel positions) above max_memory (CheckKvMemory).
  /// `on_listening` runs once bound, with the port (before the model loads); `on_loaded` once the
  /// model is loaded, before the server is ready (a front end reports the load; an error it
  /// returns stops the server and is Start's).
  static Result<std::unique_ptr<Server>> Start(const ServeOptions& options,
                                               const std::function<void(int port)>& on_listening = nullptr,
                                               const std::function<Status(const Model&)>& on_loaded = nullptr);
  ~Server();
  int port() const;
  /// KV positions of each sequence: --ctx_size within max_position_embeddings.
  int64_t context_size() const;
  /// Stops accepting new requests (they get 503), lets running ones finish, then stops the
  /// listener; Wait returns afterwards. Safe to call from any thread (not a signal handler).
  void Drain();
  /// Blocks until the server has stopped (after Drain).
  void Wait();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble
