// Ctrl-C for the CLI's long commands: while a CancelOnSignal is alive, SIGINT and SIGTERM cancel
// its CancellationToken, which the command hands to the library call (quantize, convert,
// export-onnx, perplexity, compare); the call stops at its next check with kCancelled, its output
// not written, and the command exits with the shell's code for the signal (CancelledExitCode).
// The handler is installed with SA_RESETHAND: a second Ctrl-C gets the default action and kills
// at once. Shared by `nibble` and `nibble-export-onnx` (compiled into both).
#pragma once

#include <string>

#include <nibble/cancel.h>

namespace nibble_cli {

/// Installs the SIGINT / SIGTERM handlers for its lifetime (the previous ones come back after);
/// a signal the process ignores (a background job's SIGINT) stays ignored. The handlers run on an
/// alternate signal stack of the constructing thread (the main thread, which receives the
/// process's signals). One at a time per process.
class CancelOnSignal {
 public:
  CancelOnSignal();
  ~CancelOnSignal();
  CancelOnSignal(const CancelOnSignal&) = delete;
  CancelOnSignal& operator=(const CancelOnSignal&) = delete;

  /// The token the handlers cancel, for the call's options.
  const nibble::CancellationToken* token() const { return &token_; }

 private:
  nibble::CancellationToken token_;
};

/// Starts the OpenMP worker threads (one per processor) with SIGINT and SIGTERM blocked, so they
/// keep them blocked for life (a thread inherits its creator's mask) and the main thread takes
/// every Ctrl-C: a handler never runs on a worker whose stack pointer oneDNN has moved into
/// the heap. Call first thing in main().
void StartWorkersWithSignalsBlocked();

/// The signal that last cancelled a CancelOnSignal's token (SIGINT, SIGTERM), or 0.
int CancelSignal();

/// 128 + the signal (130 for SIGINT, 143 for SIGTERM: the shell's convention); 1 (kExitRuntime)
/// for a call cancelled without one.
int CancelledExitCode(int signal);

/// Prints "nibble: <message> (SIGINT)" to stderr for a kCancelled error and returns
/// CancelledExitCode(CancelSignal()).
int FailCancelled(const std::string& message);

}  // namespace nibble_cli
