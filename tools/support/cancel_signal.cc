#include "support/cancel_signal.h"

#include <omp.h>
#include <signal.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <utility>

namespace nibble_cli {

namespace {

// What the handler touches: the token (a pointer to it, set before the handlers are installed)
// and the signal's number. Both lock-free: a handler may only store to such objects.
std::atomic<const nibble::CancellationToken*> g_token{nullptr};
volatile std::sig_atomic_t g_signal = 0;
static_assert(std::atomic<const nibble::CancellationToken*>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);  // CancellationToken's flag

struct sigaction g_old_int, g_old_term;

// The handler's own stack (SA_ONSTACK). oneDNN's JIT sgemm kernels (x64 gemm f32, the GEMMs of
// every forward and of GPTQ / AWQ calibration) point RSP into a heap workspace while they run
// (oneDNN issue 4845, fixed in 3.11; Debian 12 ships 2.6): a handler run on the interrupted
// stack writes its signal frame into that heap block and corrupts the allocator's chunk headers
// ("corrupted size vs. prev_size" at a later free). On this stack the frame never lands there.
// Linux delivers a process-directed signal to the main thread (which installs this) unless it
// blocks the signal or one is already pending for it; the OpenMP workers block both
// (StartWorkersWithSignalsBlocked), so they never take one.
constexpr size_t kAltStackBytes = 64 * 1024;  // the AVX-512 signal frame is a few KB
alignas(64) unsigned char g_alt_stack[kAltStackBytes];
stack_t g_old_stack;

extern "C" void OnCancelSignal(int sig) {
  g_signal = sig;
  if (const nibble::CancellationToken* t = g_token.load(std::memory_order_relaxed)) t->Cancel();
}

}  // namespace

void StartWorkersWithSignalsBlocked() {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);
#pragma omp parallel num_threads(omp_get_num_procs())
  { (void)omp_get_thread_num(); }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

CancelOnSignal::CancelOnSignal() {
  g_signal = 0;
  g_token.store(&token_, std::memory_order_relaxed);
  stack_t ss{};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = kAltStackBytes;
  sigaltstack(&ss, &g_old_stack);
  struct sigaction sa {};
  sa.sa_handler = OnCancelSignal;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: the next same signal takes the default action (a second Ctrl-C kills).
  // SA_RESTART: reads and writes in progress are resumed, not failed with EINTR.
  // SA_ONSTACK: the handler runs on g_alt_stack, never on the interrupted code's RSP.
  sa.sa_flags = SA_RESETHAND | SA_RESTART | SA_ONSTACK;
  for (auto [sig, old] : {std::pair{SIGINT, &g_old_int}, std::pair{SIGTERM, &g_old_term}}) {
    sigaction(sig, nullptr, old);
    // An ignored signal stays ignored (a shell starts background jobs with SIGINT ignored).
    if (old->sa_handler != SIG_IGN) sigaction(sig, &sa, nullptr);
  }
}

CancelOnSignal::~CancelOnSignal() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaltstack(&g_old_stack, nullptr);
  g_token.store(nullptr, std::memory_order_relaxed);
}

int CancelSignal() { return g_signal; }

int CancelledExitCode(int signal) { return signal > 0 ? 128 + signal : 1; }

int FailCancelled(const std::string& message) {
  const int sig = CancelSignal();
  const char* name = sig == SIGINT ? " (SIGINT)" : sig == SIGTERM ? " (SIGTERM)" : "";
  std::fprintf(stderr, "nibble: %s%s\n", message.c_str(), name);
  return CancelledExitCode(sig);
}

}  // namespace nibble_cli
