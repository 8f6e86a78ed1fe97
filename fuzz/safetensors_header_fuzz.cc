// Fuzz target: the safetensors parser on arbitrary bytes. Every accepted header must describe
// tensors that lie inside the buffer (each byte is read to let ASan check it).
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto h = nibble::ParseSafetensors(data, size, "fuzz.safetensors");
  if (!h.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const auto& t : h->tensors) {
    if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
    for (size_t i = 0; i < t.nbytes; ++i) sink ^= t.data[i];
    if (static_cast<uint64_t>(t.numel()) * nibble::DTypeSize(t.dtype) != t.nbytes) __builtin_trap();
  }
  return 0;
}
