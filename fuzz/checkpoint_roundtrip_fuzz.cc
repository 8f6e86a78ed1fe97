// Structured fuzz target: random shapes / group sizes / schemes / pack methods / scale dtypes and
// codes -> Quark export -> safetensors bytes -> parse -> import must give back the same matrix.
// A mutated byte of the serialized file must give an error or a valid matrix, never a crash.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/int4_matrix.h"
#include "formats/quark_pack.h"
#include "io/safetensors.h"

namespace {

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t Byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nibble;
  Reader r{data, size};
  const int64_t n = 1 + r.Byte() % 70;
  const int64_t groups = 1 + r.Byte() % 4;
  const int64_t gsel = r.Byte() % 4;
  const bool sym = r.Byte() & 1;
  const PackMethod pack = (r.Byte() & 1) ? PackMethod::kOrder : PackMethod::kReorder;
  const DType sdt = (const DType[]){DType::kF32, DType::kF16, DType::kBF16}[r.Byte() % 3];
  const bool per_channel = gsel == 3;
  const int64_t g = per_channel ? 8 * (1 + r.Byte() % 9) : (const int64_t[]){8, 32, 64}[gsel];
  const int64_t k = per_channel ? g : g * groups;

  WeightQuantSpec spec;
  spec.dtype = sym ? QuantDType::kInt4 : QuantDType::kUint4;
  spec.symmetric = sym;
  if (per_channel) {
    spec.qscheme = QScheme::kPerChannel;
    spec.ch_axis = 0;
    spec.group_size = -1;
  } else {
    spec.group_size = g;
  }
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = per_channel ? k : g;
  m.symmetric = sym;
  m.codes.resize(n * k);
  for (auto& c : m.codes) c = r.Byte() & 15;
  m.scales.resize(n * m.groups());
  for (auto& s : m.scales) s = static_cast<float>(1 + r.Byte()) / 256.0f;  // exact in bf16/f16
  m.zero_points.resize(n * m.groups());
  for (auto& z : m.zero_points) z = sym ? 8 : (r.Byte() & 15);

  auto t = ExportQuarkLinear("p", m, spec, pack, sdt);
  if (!t.ok()) __builtin_trap();
  auto bytes = SerializeSafetensors({&t->weight, &t->weight_scale, &t->weight_zero_point}, {});
  if (!bytes.ok()) __builtin_trap();
  auto h = ParseSafetensors(bytes->data(), bytes->size(), "roundtrip");
  if (!h.ok() || h->tensors.size() != 3) __builtin_trap();
  auto find = [&](const char* name) -> const TensorView* {
    for (const auto& v : h->tensors)
      if (v.name == name) return &v;
    return nullptr;
  };
  QuarkLinearViews views{find("p.weight"), find("p.weight_scale"), find("p.weight_zero_point")};
  auto back = ImportQuarkLinear(views, "p", spec, pack, n, k);
  if (!back.ok() || !(*back == m)) __builtin_trap();

  // Corrupt one byte of the serialized file: parse + import must not crash.
  if (r.n >= 3) {
    std::vector<uint8_t> bad = *bytes;
    const size_t at = (static_cast<size_t>(r.Byte()) << 8 | r.Byte()) % bad.size();
    bad[at] ^= static_cast<uint8_t>(1 + r.Byte() % 255);
    auto h2 = ParseSafetensors(bad.data(), bad.size(), "corrupt");
    if (h2.ok() && h2->tensors.size() == 3) {
      QuarkLinearViews v2{&h2->tensors[0], &h2->tensors[1], &h2->tensors[2]};
      (void)ImportQuarkLinear(v2, "p", spec, pack, n, k);
    }
  }
  return 0;
}
