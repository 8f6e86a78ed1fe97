// How the decode loops (one weight row streamed at a time) prefetch ahead along the row. Chosen
// once per process by the dispatch (kernels/int4_dispatch.h) from the CPU vendor, since the best
// hint differs: on AMD Zen 5 `prefetchnta` was the fastest hint measured, while on Intel Xeons
// (Sapphire / Emerald Rapids) a `prefetchnta` line goes to L1 only and the loops stall on it, at
// about half the speed of `prefetcht0` from DRAM (docs/PERFORMANCE.md "Decode prefetch on Intel").
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace nibble {

enum class StreamPrefetch {
  kNonTemporal,  // prefetchnta
  kL1,           // prefetcht0
};

/// "nta" | "t0": the name NIBBLE_PREFETCH takes and `inspect --kernels` prints.
inline const char* StreamPrefetchName(StreamPrefetch p) { return p == StreamPrefetch::kL1 ? "t0" : "nta"; }

/// The decode loops' prefetch: `bytes` past `p` along the row, with the hint P.
template <StreamPrefetch P>
inline void PrefetchAhead(const void* p, int64_t bytes) {
#if defined(__x86_64__)
  const char* a = static_cast<const char*>(p) + bytes;
  if constexpr (P == StreamPrefetch::kL1)
    _mm_prefetch(a, _MM_HINT_T0);
  else
    _mm_prefetch(a, _MM_HINT_NTA);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace nibble
