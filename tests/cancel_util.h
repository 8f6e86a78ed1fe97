// Cancelling a library call from another thread at a known point of it: the call's own callback
// (progress, on_window, on_message) calls Trigger(), which has a second thread cancel the token
// and waits until it has. The call then meets a cancelled token at its next check, as it would
// after a Ctrl-C handler or a server thread cancelled it, but at a point the test chose.
#pragma once

#include <atomic>
#include <future>
#include <thread>

#include <nibble/cancel.h>

namespace nibble_test {

class CancelFromThread {
 public:
  explicit CancelFromThread(const nibble::CancellationToken& token)
      : done_(done_promise_.get_future()), thread_([this, token] {
          go_.get_future().wait();
          if (!released_.load()) token.Cancel();
          done_promise_.set_value();
        }) {}
  ~CancelFromThread() {
    if (!triggered_.exchange(true)) {  // never triggered: let the thread end without cancelling
      released_.store(true);
      go_.set_value();
    }
    thread_.join();
  }
  CancelFromThread(const CancelFromThread&) = delete;
  CancelFromThread& operator=(const CancelFromThread&) = delete;

  /// The first call has the other thread cancel the token and returns once it has; later calls
  /// do nothing.
  void Trigger() {
    if (triggered_.exchange(true)) return;
    go_.set_value();
    done_.wait();
  }
  bool triggered() const { return triggered_.load(); }

 private:
  std::promise<void> go_, done_promise_;
  std::future<void> done_;
  std::atomic<bool> triggered_{false}, released_{false};
  std::thread thread_;
};

}  // namespace nibble_test
