// The worker threads behind ParallelFor (base/parallel.h): a loop's range is cut into chunks
// that threads claim one at a time, and the caller returns as soon as every chunk has run. An
// OpenMP team ends in a barrier that waits for every thread to arrive, also one the OS has
// descheduled and that has nothing left to do; on a machine busy with other work that wait cost
// decode 4-5x against one thread (docs/PERFORMANCE.md "Threads on a busy machine"). Here a
// late worker finds nothing to claim and the caller never waits for it; it waits only for
// chunks already claimed, which are short.
#pragma once

#include <cstdint>

namespace nibble {

/// Runs call(ctx, begin, end) over [0, n) cut into chunks, on the calling thread and up to
/// `threads` - 1 pool workers, and returns when all chunks have run. Runs everything on the
/// calling thread when threads <= 1, when called from inside a chunk, or while another thread's
/// loop holds the pool. `call` must not throw. Workers start on first use with SIGINT and
/// SIGTERM blocked (the process's signals go to its other threads).
void ClaimChunks(int64_t n, int threads, void (*call)(void* ctx, int64_t begin, int64_t end), void* ctx);

/// Whether the calling thread is running a chunk of ClaimChunks (nested loops run serially).
bool InClaimedChunk();

}  // namespace nibble
