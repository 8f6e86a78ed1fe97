// Up-front checks of large allocations against the memory a process can get, so that a size
// from a file (a config.json's context, layer count, ...) gives a named error instead of a
// std::bad_alloc or minutes of swapping.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"

namespace nibble {

/// Bytes a new allocation can use: /proc/meminfo's MemAvailable, lowered to what RLIMIT_AS leaves
/// of this process's address space (VmSize in /proc/self/statm) when a limit is set; -1 when
/// neither is known.
int64_t AvailableMemoryBytes();

/// Ok when `bytes` fits AvailableMemoryBytes() (or it is unknown). Else an error naming `what`,
/// the bytes needed and those available, e.g. "the KV cache of 131072 positions needs 16.0 GiB,
/// more than the 3.2 GiB of memory available (MemAvailable)".
Status CheckMemoryFor(double bytes, const std::string& what);

/// `bytes` as "512 B", "3.2 MiB", "16.0 GiB" for messages.
std::string FormatBytes(double bytes);

}  // namespace nibble
