#include "api/size.h"

#include <cstdio>
#include <string>

namespace nibble {

SizeSummary SizeOfQuantized(const std::vector<QuantizeSummary::Layer>& layers, int64_t tensor_bytes) {
  SizeSummary s;
  s.tensor_bytes = s.float_tensor_bytes = tensor_bytes;
  int64_t float_bytes = 0;
  for (const auto& l : layers) {
    if (!l.quantized) continue;
    ++s.quantized_linears;
    s.quantized_weights += l.n * l.k;
    s.quantized_bytes += l.bytes_out;
    float_bytes += l.bytes_in;
  }
  s.float_tensor_bytes += float_bytes - s.quantized_bytes;
  s.float_bits = s.quantized_weights > 0 ? static_cast<int>(8 * float_bytes / s.quantized_weights) : 0;
  return s;
}

SizeSummary SizeOfInspected(const std::vector<InspectReport::Layer>& layers, int64_t tensor_bytes, int float_bits) {
  SizeSummary s;
  s.tensor_bytes = s.float_tensor_bytes = tensor_bytes;
  s.float_bits = float_bits;
  for (const auto& l : layers) {
    if (!l.quantized) continue;
    ++s.quantized_linears;
    s.quantized_weights += l.n * l.k;
    s.quantized_bytes += l.stored_bytes;
    s.float_tensor_bytes += l.float_bytes - l.stored_bytes;
  }
  return s;
}

namespace {
// 3104768 -> "3,104,768".
std::string Grouped(int64_t v) {
  std::string d = std::to_string(v), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}
}  // namespace

std::string FormatSize(const SizeSummary& s) {
  char buf[256];
  const std::string bytes = Grouped(s.tensor_bytes);
  if (s.quantized_linears == 0) {
    std::snprintf(buf, sizeof(buf), "no quantized linears; tensors %s bytes (%.2f MB)", bytes.c_str(), s.tensor_bytes / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "%.2f bits/weight in %lld quantized linear%s (scales and zero points included); tensors %s bytes "
                  "(%.2f MB), %.2fx smaller than with %d-bit float linears",
                  s.bits_per_weight(), static_cast<long long>(s.quantized_linears), s.quantized_linears == 1 ? "" : "s",
                  bytes.c_str(), s.tensor_bytes / 1e6,
                  s.tensor_bytes > 0 ? static_cast<double>(s.float_tensor_bytes) / static_cast<double>(s.tensor_bytes) : 0.0,
                  s.float_bits);
  }
  return buf;
}

}  // namespace nibble
