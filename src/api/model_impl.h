// The runtime behind the public Model handle (shared by the src/api/ translation units), and the
// per-call thread setting.
#pragma once

#include <memory>

#include <nibble/model.h>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct Model::Impl {
  ModelInfo info;
  std::unique_ptr<LlamaModel> llama;
  std::unique_ptr<Tokenizer> tokenizer;
};

/// The library's access to a Model's runtime.
struct ModelAccess {
  static const LlamaModel& llama(const Model& m) { return *m.impl_->llama; }
  static const Tokenizer& tokenizer(const Model& m) { return *m.impl_->tokenizer; }
};

/// A call's or session's `threads`: 0..kMaxThreads, else an error naming the value (thousands of
/// OpenMP threads would exhaust the process before any work).
Status CheckThreads(int n);

/// Sets the calling thread's compute threads for one call (n > 0) and restores them after; n = 0
/// keeps the current setting. OpenMP's thread count is per calling thread, so concurrent calls
/// from different threads each run with their own.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n);
  ~ScopedThreads();
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_ = 0;
};

/// The tokenizer layer's name for a public TokenizerType.
inline TokenizerKind ToTokenizerKind(TokenizerType t) {
  return t == TokenizerType::kHf ? TokenizerKind::kHf : t == TokenizerType::kSpm ? TokenizerKind::kSpm : TokenizerKind::kAuto;
}

}  // namespace nibble
