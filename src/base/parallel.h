// OpenMP regions only where they pay. libgomp builds a team for every `#pragma omp parallel`,
// also under `if (false)` and for a team of one thread (its cost: docs/PERFORMANCE.md "Parallel
// regions"), which decode would pay several times per layer and token.
#pragma once

#include <omp.h>

#include <cstdint>

namespace nibble {

/// Work (multiply-adds or element operations) from which a kernel or row loop opens a team:
/// below it a region's cost is a large share of the loop's time.
inline constexpr int64_t kTeamMinWork = int64_t{1} << 16;

/// Whether a parallel region would run on more than one thread: the work is `worth` a team, more
/// than one thread is allowed, and the caller is not already inside a parallel region (a nested
/// region gets one thread).
inline bool OpenTeam(bool worth) { return worth && !omp_in_parallel() && omp_get_max_threads() > 1; }

/// f(i) for i in [0, n): a static schedule over the team when OpenTeam(worth), else in order on
/// the calling thread. For independent iterations, so the result is the same either way.
template <class F>
void ParallelFor(int64_t n, bool worth, F&& f) {
  if (OpenTeam(worth)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) f(i);
  } else {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

}  // namespace nibble
