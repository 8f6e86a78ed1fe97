// Cancellation of long calls (prefill, generate, perplexity, quantize, convert, export): the
// caller keeps a CancellationToken, passes it in the call's options and calls Cancel() from any
// thread; the call notices at its next check (at least once per decoder layer) and returns an
// Error with ErrorCode::kCancelled. Copies share one state, so a copy handed to a worker cancels
// with the original. Cancel is one relaxed store: safe from a signal handler.
#pragma once

#include <atomic>
#include <memory>
#include <string_view>

#include <nibble/error.h>

namespace nibble {

class CancellationToken {
 public:
  CancellationToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  /// Asks every call holding this token (or a copy) to stop; it cannot be undone.
  void Cancel() const { flag_->store(true, std::memory_order_relaxed); }
  bool cancelled() const { return flag_->load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

/// Ok unless `token` is non-null and cancelled; then kCancelled naming `what` ("prefill at layer 3").
inline Status CheckCancelled(const CancellationToken* token, std::string_view what) {
  if (token == nullptr || !token->cancelled()) return Status::Ok();
  return MakeErrorCode(ErrorCode::kCancelled, "cancelled: ", what);
}

}  // namespace nibble
