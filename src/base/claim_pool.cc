#include "base/claim_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NIBBLE_PAUSE() _mm_pause()
#else
#define NIBBLE_PAUSE() ((void)0)
#endif

namespace nibble {

namespace {

// Spin this many pause loops waiting for the next loop before sleeping (decode's loops come
// microseconds apart; the same count the CLI gives OpenMP, tools/support/load_env.h); a
// caller spins as long before yielding its core to a claimed chunk's thread.
constexpr int kSpins = 10000;
// Chunks per thread: small enough that a descheduled worker rarely holds one, large enough
// that claiming (one compare-and-swap) stays far below a chunk's work.
constexpr int64_t kChunksPerThread = 16;

thread_local bool t_in_chunk = false;

// One loop at a time. `state` packs the loop's generation (24 bits), its chunk count (20 bits)
// and the next unclaimed chunk (20 bits), so that a claim is one compare-and-swap that fails
// for any other loop than the one whose fields the claimer read.
struct Pool {
  std::mutex submit;                 // held by the thread whose loop runs
  std::mutex grow;                   // guards workers
  std::atomic<uint64_t> state{0};
  std::atomic<uint32_t> generation{0};  // what idle workers wait on
  std::atomic<int64_t> done{0};      // chunks finished of the current loop
  std::atomic<int> helpers{0};       // workers 0 .. helpers-1 may join the current loop
  void (*call)(void*, int64_t, int64_t) = nullptr;
  void* ctx = nullptr;
  int64_t n = 0;
  int64_t chunk = 1;
  std::vector<std::thread> workers;
};

constexpr uint64_t kField = (uint64_t{1} << 20) - 1;
constexpr int64_t kMaxChunks = static_cast<int64_t>(kField);
uint64_t Pack(uint64_t gen, uint64_t chunks, uint64_t next) { return (gen & 0xFFFFFF) << 40 | chunks << 20 | next; }

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: workers may outlive static destruction
  return *pool;
}

// Claims and runs chunks of loop `gen` until none is left.
void Work(Pool& p, uint64_t gen) {
  uint64_t s = p.state.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t chunks = s >> 20 & kField, next = s & kField;
    if ((s >> 40) != (gen & 0xFFFFFF) || next >= chunks) return;
    if (!p.state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Claimed: the loop cannot end before this chunk does, so its fields stay as published.
    const int64_t begin = static_cast<int64_t>(next) * p.chunk, end = std::min(p.n, begin + p.chunk);
    t_in_chunk = true;
    p.call(p.ctx, begin, end);
    t_in_chunk = false;
    p.done.fetch_add(1, std::memory_order_acq_rel);
    s = p.state.load(std::memory_order_acquire);
  }
}

void WorkerMain(Pool& p, int index) {
  uint32_t seen = p.generation.load(std::memory_order_acquire);
  for (;;) {
    uint32_t gen = p.generation.load(std::memory_order_acquire);
    for (int i = 0; i < kSpins && gen == seen; ++i) {
      NIBBLE_PAUSE();
      gen = p.generation.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      p.generation.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = gen;
    if (index < p.helpers.load(std::memory_order_acquire)) Work(p, gen);
  }
}

// Starts workers until there are `count` (called with p.submit held).
void EnsureWorkers(Pool& p, int count) {
  std::lock_guard<std::mutex> lock(p.grow);
  if (static_cast<int>(p.workers.size()) >= count) return;
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  while (static_cast<int>(p.workers.size()) < count) {
    const int index = static_cast<int>(p.workers.size());
    p.workers.emplace_back([&p, index] { WorkerMain(p, index); });
    p.workers.back().detach();
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void RunSerial(int64_t n, void (*call)(void*, int64_t, int64_t), void* ctx) {
  if (n > 0) call(ctx, 0, n);
}

}  // namespace

bool InClaimedChunk() { return t_in_chunk; }

void ClaimChunks(int64_t n, int threads, void (*call)(void*, int64_t, int64_t), void* ctx) {
  if (n <= 0) return;
  Pool& p = ThePool();
  if (threads <= 1 || n == 1 || t_in_chunk) return RunSerial(n, call, ctx);
  std::unique_lock<std::mutex> lock(p.submit, std::try_to_lock);
  if (!lock.owns_lock()) return RunSerial(n, call, ctx);
  EnsureWorkers(p, threads - 1);
  const int64_t chunks = std::min({n, static_cast<int64_t>(threads) * kChunksPerThread, kMaxChunks});
  p.call = call;
  p.ctx = ctx;
  p.n = n;
  p.chunk = (n + chunks - 1) / chunks;
  const int64_t real_chunks = (n + p.chunk - 1) / p.chunk;
  p.done.store(0, std::memory_order_relaxed);
  p.helpers.store(threads - 1, std::memory_order_relaxed);
  const uint32_t gen = p.generation.load(std::memory_order_relaxed) + 1;
  p.state.store(Pack(gen, static_cast<uint64_t>(real_chunks), 0), std::memory_order_release);
  p.generation.store(gen, std::memory_order_release);
  p.generation.notify_all();
  Work(p, gen);
  // Only chunks already claimed remain; their threads are running or were just descheduled.
  for (int spins = 0; p.done.load(std::memory_order_acquire) < real_chunks; ++spins) {
    if (spins < kSpins) {
      NIBBLE_PAUSE();
    } else {
      sched_yield();
    }
  }
}

}  // namespace nibble
