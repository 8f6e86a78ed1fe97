// OpenMP regions only where they pay. libgomp builds a team for every `#pragma omp parallel`,
// also under `if (false)` and for a team of one thread (its cost: docs/PERFORMANCE.md "Parallel
// regions"), which decode would pay several times per layer and token.
#pragma once

#include <omp.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "base/claim_pool.h"

namespace nibble {

/// Work (multiply-adds or element operations) from which a kernel or row loop opens a team:
/// below it a region's cost is a large share of the loop's time.
inline constexpr int64_t kTeamMinWork = int64_t{1} << 16;

/// Whether a parallel region would run on more than one thread: the work is `worth` a team, more
/// than one thread is allowed, and the caller is not already inside a parallel region or a
/// ParallelFor chunk (a nested region gets one thread).
inline bool OpenTeam(bool worth) {
  return worth && !omp_in_parallel() && !InClaimedChunk() && omp_get_max_threads() > 1;
}

/// f(begin, end) over chunks covering [0, n) exactly once: claimed by the calling thread and the
/// claim pool's workers (base/claim_pool.h; as many threads as the calling thread's OpenMP
/// setting) when OpenTeam(worth), else f(0, n) on the calling thread. For independent
/// iterations, so the result is the same either way. f must not throw; oneDNN called inside f
/// must be held to one thread (SingleThreadedBlas), as it would thread itself outside an OpenMP
/// region.
template <class F>
void ParallelRanges(int64_t n, bool worth, F&& f) {
  if (n <= 0) return;
  if (!OpenTeam(worth)) return f(int64_t{0}, n);
  auto run = [](void* ctx, int64_t begin, int64_t end) { (*static_cast<std::remove_reference_t<F>*>(ctx))(begin, end); };
  ClaimChunks(n, omp_get_max_threads(), run, const_cast<void*>(static_cast<const void*>(&f)));
}

/// f(i) for i in [0, n), as ParallelRanges.
template <class F>
void ParallelFor(int64_t n, bool worth, F&& f) {
  ParallelRanges(n, worth, [&f](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) f(i);
  });
}

/// produce(i, worker) for i in [0, n) on up to `threads` threads (the calling thread and an
/// OpenMP team; worker in [0, threads) names the thread, for per-thread scratch), claimed in
/// order and at most `window` items ahead of consume; consume(i) on the calling thread only, in
/// the order 0, 1, ..., each as soon as its produce is done. So what consume does (writing a
/// file, progress callbacks) keeps its order and thread whatever the thread count. consume
/// returning false stops the loop: nothing more is claimed, items already claimed finish, and
/// OrderedParallelFor returns false. produce runs with nested regions held to one thread
/// (omp_in_parallel); neither may throw.
template <class P, class C>
bool OrderedParallelFor(int64_t n, int threads, int64_t window, P&& produce, C&& consume) {
  if (threads <= 1 || n <= 1 || omp_in_parallel() || InClaimedChunk()) {
    for (int64_t i = 0; i < n; ++i) {
      produce(i, 0);
      if (!consume(i)) return false;
    }
    return true;
  }
  std::mutex mu;
  std::condition_variable cv;
  int64_t next_claim = 0, next_consume = 0;
  std::vector<char> done(static_cast<size_t>(n), 0);
  bool stop = false, ok = true;
#pragma omp parallel num_threads(threads)
  {
    const int worker = omp_get_thread_num();
    const bool consumer = worker == 0;  // the calling thread
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (consumer) {
        while (!stop && next_consume < n && done[static_cast<size_t>(next_consume)]) {
          const int64_t i = next_consume;
          lock.unlock();
          const bool more = consume(i);
          lock.lock();
          ++next_consume;
          if (!more) {
            ok = false;
            stop = true;
          }
          cv.notify_all();
        }
        if (stop || next_consume == n) {
          stop = true;
          cv.notify_all();
          break;
        }
      }
      if (!stop && next_claim < n && next_claim < next_consume + window) {
        const int64_t i = next_claim++;
        lock.unlock();
        produce(i, worker);
        lock.lock();
        done[static_cast<size_t>(i)] = 1;
        cv.notify_all();
        continue;
      }
      if (!consumer && (stop || next_claim >= n)) break;
      cv.wait(lock);
    }
  }
  return ok;
}

/// Holds the calling thread's OpenMP thread count at 1 for its scope, so that oneDNN runs its
/// GEMMs single-threaded (the same arithmetic for any thread count) in a ParallelRanges chunk.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreadedBlas() { omp_set_num_threads(saved_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

}  // namespace nibble
