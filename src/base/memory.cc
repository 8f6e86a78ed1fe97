#include "base/memory.h"

#include <sys/resource.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <mutex>

namespace nibble {

namespace {

// MemAvailable in bytes, -1 when /proc/meminfo has none.
int64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// RLIMIT_AS minus the address space in use, -1 when unlimited or unknown.
int64_t AddressSpaceLeft() {
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return -1;
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0;
  if (!(in >> pages)) return -1;
  const int64_t used = pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  const int64_t limit = static_cast<int64_t>(lim.rlim_cur);
  return limit > used ? limit - used : 0;
}

std::mutex retain_mu;
int retain_depth = 0;  // RetainFreedMemory scopes alive

}  // namespace

RetainFreedMemory::RetainFreedMemory() {
  std::lock_guard<std::mutex> lock(retain_mu);
  if (retain_depth++ > 0) return;
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);              // large blocks from the heap, reusable after free
  mallopt(M_TRIM_THRESHOLD, INT_MAX);  // the heap's free top is kept
#endif
}

RetainFreedMemory::~RetainFreedMemory() {
  std::lock_guard<std::mutex> lock(retain_mu);
  if (--retain_depth > 0) return;
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 65536);  // glibc's defaults
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  malloc_trim(0);
#endif
}

void ReleaseFreedMemory() {
  std::lock_guard<std::mutex> lock(retain_mu);
  if (retain_depth > 0) return;
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

int64_t AvailableMemoryBytes() {
  const int64_t mem = MemAvailable(), as = AddressSpaceLeft();
  if (mem < 0) return as;
  return as < 0 ? mem : std::min(mem, as);
}

int64_t DefaultMemoryLimit() {
  const int64_t available = AvailableMemoryBytes();
  return available < 0 ? -1 : available / 10 * 9;
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

Status CheckMemoryFor(double bytes, const std::string& what) {
  const int64_t avail = AvailableMemoryBytes();
  if (avail < 0 || bytes <= static_cast<double>(avail)) return Status::Ok();
  return MakeError(what, " needs ", FormatBytes(bytes), ", more than the ",
                   FormatBytes(static_cast<double>(avail)), " of memory available (MemAvailable",
                   AddressSpaceLeft() >= 0 ? ", RLIMIT_AS" : "", ")");
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "RssAnon: %lld", &kib) == 1) m.anon = kib * 1024;
    else if (std::sscanf(line.c_str(), "RssFile: %lld", &kib) == 1) m.file = kib * 1024;
    else if (std::sscanf(line.c_str(), "VmHWM: %lld", &kib) == 1) m.hwm = kib * 1024;
  }
  return m;
}

PeakMemorySampler::PeakMemorySampler(int period_ms) {
  peaks_.start_anon = ReadProcessMemory().anon;
  Sample();
  thread_ = std::thread([this, period_ms] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(period_ms), [this] { return stop_; })) {
      lock.unlock();
      Sample();
      lock.lock();
    }
  });
}

PeakMemorySampler::~PeakMemorySampler() { Stop(); }

void PeakMemorySampler::Sample() {
  const ProcessMemory m = ReadProcessMemory();
  std::lock_guard<std::mutex> lock(mu_);
  peaks_.peak_anon = std::max(peaks_.peak_anon, m.anon);
  peaks_.peak_file = std::max(peaks_.peak_file, m.file);
  peaks_.hwm = m.hwm;
}

PeakMemorySampler::Peaks PeakMemorySampler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    Sample();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return peaks_;
}

}  // namespace nibble
