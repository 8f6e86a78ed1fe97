// The CLI's Ctrl-C handling (tools/support/cancel_signal.h): while a CancelOnSignal is alive,
// SIGINT / SIGTERM cancel its token and are recorded for the exit code; the handler resets to the
// default action on delivery (a second Ctrl-C kills), an ignored signal stays ignored, and the
// previous handlers come back after.
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "support/cancel_signal.h"

namespace {

using nibble_cli::CancelOnSignal;
using Action = void (*)(int);

// The current action for `sig`.
Action Handler(int sig) {
  struct sigaction sa {};
  sigaction(sig, nullptr, &sa);
  return sa.sa_handler;
}

// Sets the action for `sig`; returns the old one.
struct sigaction SetHandler(int sig, Action a) {
  struct sigaction sa {}, old {};
  sa.sa_handler = a;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, &old);
  return old;
}

volatile sig_atomic_t g_own_calls = 0;
void OwnHandler(int) { g_own_calls = g_own_calls + 1; }

TEST(CancelOnSignal, SigintCancelsTheTokenAndTheNextOneGetsTheDefaultAction) {
  const struct sigaction saved = SetHandler(SIGINT, SIG_DFL);
  {
    const CancelOnSignal interrupt;
    EXPECT_FALSE(interrupt.token()->cancelled());
    EXPECT_NE(Handler(SIGINT), SIG_DFL);
    EXPECT_EQ(nibble_cli::CancelSignal(), 0);
    ASSERT_EQ(raise(SIGINT), 0);  // handled: the process goes on
    EXPECT_TRUE(interrupt.token()->cancelled());
    EXPECT_EQ(nibble_cli::CancelSignal(), SIGINT);
    EXPECT_EQ(Handler(SIGINT), SIG_DFL);  // a second Ctrl-C would kill
  }
  EXPECT_EQ(Handler(SIGINT), SIG_DFL);
  sigaction(SIGINT, &saved, nullptr);
  EXPECT_EQ(nibble_cli::CancelledExitCode(SIGINT), 130);
  EXPECT_EQ(nibble_cli::CancelledExitCode(SIGTERM), 143);
  EXPECT_EQ(nibble_cli::CancelledExitCode(0), 1);
}

TEST(CancelOnSignal, SigtermCancelsAndThePreviousHandlerComesBack) {
  const struct sigaction saved = SetHandler(SIGTERM, OwnHandler);
  g_own_calls = 0;
  {
    const CancelOnSignal interrupt;
    ASSERT_EQ(raise(SIGTERM), 0);
    EXPECT_TRUE(interrupt.token()->cancelled());
    EXPECT_EQ(nibble_cli::CancelSignal(), SIGTERM);
    EXPECT_EQ(g_own_calls, 0);
  }
  EXPECT_EQ(Handler(SIGTERM), OwnHandler);
  {
    const CancelOnSignal next;  // each scope starts uncancelled
    EXPECT_FALSE(next.token()->cancelled());
    EXPECT_EQ(nibble_cli::CancelSignal(), 0);
  }
  sigaction(SIGTERM, &saved, nullptr);
}

TEST(CancelOnSignal, AnIgnoredSigintStaysIgnored) {
  const struct sigaction saved = SetHandler(SIGINT, SIG_IGN);
  {
    const CancelOnSignal interrupt;
    EXPECT_EQ(Handler(SIGINT), SIG_IGN);
    ASSERT_EQ(raise(SIGINT), 0);
    EXPECT_FALSE(interrupt.token()->cancelled());
  }
  EXPECT_EQ(Handler(SIGINT), SIG_IGN);
  sigaction(SIGINT, &saved, nullptr);
}

#if defined(__x86_64__) && defined(__linux__)
// Sends `sig` to this thread (tgkill) with RSP pointing to `sp`, as oneDNN's JIT sgemm kernels
// run with RSP inside a heap workspace; the signal is delivered on the syscall's return.
void SignalWithStackAt(unsigned char* sp, int sig) {
  long ret = SYS_tgkill;
  asm volatile(
      "mov %%rsp, %%r12\n\t"
      "mov %[sp], %%rsp\n\t"
      "syscall\n\t"
      "mov %%r12, %%rsp\n\t"
      : "+a"(ret)
      : "D"(static_cast<long>(getpid())), "S"(static_cast<long>(gettid())), "d"(static_cast<long>(sig)), [sp] "r"(sp)
      : "rcx", "r11", "r12", "memory", "cc");
  ASSERT_EQ(ret, 0);
}

// The handler's frame goes on its own stack, never below the interrupted code's RSP: a signal
// taken inside a oneDNN JIT GEMM (RSP in a heap block) used to write its frame into the heap and
// abort a cancelled quantize with "corrupted size vs. prev_size".
TEST(CancelOnSignal, TheHandlerDoesNotWriteBelowTheInterruptedStackPointer) {
  const struct sigaction saved = SetHandler(SIGINT, SIG_DFL);
  std::vector<unsigned char> block(64 * 1024, 0xA5);  // stands for the JIT kernel's workspace
  {
    const CancelOnSignal interrupt;
    SignalWithStackAt(block.data() + block.size() - 256, SIGINT);
    EXPECT_TRUE(interrupt.token()->cancelled());
    EXPECT_EQ(nibble_cli::CancelSignal(), SIGINT);
  }
  sigaction(SIGINT, &saved, nullptr);
  const auto changed = std::count_if(block.begin(), block.end(), [](unsigned char b) { return b != 0xA5; });
  EXPECT_EQ(changed, 0) << "the signal frame was written below the interrupted RSP";
}
#endif

}  // namespace

namespace {

// OpenMP workers started by StartWorkersWithSignalsBlocked keep SIGINT and SIGTERM blocked; the
// calling (main) thread's mask is as before, so it alone takes them.
TEST(CancelOnSignal, OpenMpWorkersBlockTheCancelSignals) {
  nibble_cli::StartWorkersWithSignalsBlocked();
  std::vector<int> blocked(static_cast<size_t>(omp_get_num_procs()), -1);
#pragma omp parallel num_threads(omp_get_num_procs())
  {
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, nullptr, &now);
    blocked[static_cast<size_t>(omp_get_thread_num())] = sigismember(&now, SIGINT) && sigismember(&now, SIGTERM) ? 1 : 0;
  }
  EXPECT_EQ(blocked[0], 0) << "the calling thread";
  for (size_t t = 1; t < blocked.size(); ++t) EXPECT_EQ(blocked[t], 1) << "worker " << t;
}

}  // namespace
