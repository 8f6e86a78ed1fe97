// Up-front checks of large allocations against the memory a process can get, so that a size
// from a file (a config.json's context, layer count, ...) gives a named error instead of a
// std::bad_alloc or minutes of swapping.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "base/result.h"

namespace nibble {

/// Bytes a new allocation can use: /proc/meminfo's MemAvailable, lowered to what RLIMIT_AS leaves
/// of this process's address space (VmSize in /proc/self/statm) when a limit is set; -1 when
/// neither is known.
int64_t AvailableMemoryBytes();

/// The default memory limit of every --max_memory: 90 % of AvailableMemoryBytes(), -1 unknown.
int64_t DefaultMemoryLimit();

/// Ok when `bytes` fits AvailableMemoryBytes() (or it is unknown). Else an error naming `what`,
/// the bytes needed and those available, e.g. "the KV cache of 131072 positions needs 16.0 GiB,
/// more than the 3.2 GiB of memory available (MemAvailable)".
Status CheckMemoryFor(double bytes, const std::string& what);

/// `bytes` as "512 B", "3.2 MiB", "16.0 GiB" for messages.
std::string FormatBytes(double bytes);

/// The process's resident memory from /proc/self/status, in bytes (-1 when unknown): RssAnon
/// (heap and anonymous maps: what the process itself holds), RssFile (pages of mapped files, e.g.
/// an mmap'd checkpoint: the kernel can drop them) and VmHWM (the peak of the total).
struct ProcessMemory {
  int64_t anon = -1, file = -1, hwm = -1;
};
ProcessMemory ReadProcessMemory();

/// While one is alive, memory the program frees stays in its heap instead of going back to the
/// kernel (glibc: no chunk in a mapping of its own, no trimming); the last one to end hands the
/// free pages back (malloc_trim). For work that frees and allocates buffers of the same sizes over
/// and over: each 4 KiB page handed back is zeroed again by a page fault when next used (on a VM
/// that returns freed memory to its host, also mapped again by the host). The heap can fragment
/// meanwhile, so a scope holds only work whose allocations repeat in sizes and order (one decoder
/// layer after another). Process-wide (malloc's settings are); nested and concurrent scopes are
/// counted. A no-op where the C library is not glibc.
class RetainFreedMemory {
 public:
  RetainFreedMemory();
  ~RetainFreedMemory();
  RetainFreedMemory(const RetainFreedMemory&) = delete;
  RetainFreedMemory& operator=(const RetainFreedMemory&) = delete;
};

/// Hands the heap's free pages back to the kernel now (glibc: malloc_trim over every arena; a
/// no-op elsewhere and inside a RetainFreedMemory scope). For the end of a unit of work whose
/// buffers differ in size from phase to phase: glibc keeps freed blocks that grew its mmap
/// threshold in the heaps of the threads that freed them, and the next unit's peak stacks on them.
void ReleaseFreedMemory();

/// Peaks of RssAnon and RssFile over a span of work: the kernel keeps a peak of the total only
/// (VmHWM), so a thread samples ReadProcessMemory every `period_ms` from construction to Stop.
class PeakMemorySampler {
 public:
  struct Peaks {
    int64_t start_anon = -1;  // RssAnon when sampling began
    int64_t peak_anon = -1, peak_file = -1;
    int64_t hwm = -1;  // VmHWM at Stop (the process's whole life)
  };
  explicit PeakMemorySampler(int period_ms = 20);
  ~PeakMemorySampler();
  PeakMemorySampler(const PeakMemorySampler&) = delete;
  PeakMemorySampler& operator=(const PeakMemorySampler&) = delete;
  /// Stops sampling (one last sample included); later calls return the same peaks.
  Peaks Stop();

 private:
  void Sample();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Peaks peaks_;
  std::thread thread_;
};

}  // namespace nibble
