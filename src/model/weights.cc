#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/half.h"
#include "base/parallel.h"

namespace nibble {

namespace {

// Whether the stored bits are an inf or NaN: the exponent field all ones.
bool NonFiniteBits(const uint8_t* p, DType dt) {
  if (dt == DType::kF32) {
    uint32_t b;
    std::memcpy(&b, p, 4);
    return (b & 0x7f800000u) == 0x7f800000u;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dt == DType::kBF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
}

// "[r, c]" of flat index i in `shape`.
std::string IndexString(const std::vector<int64_t>& shape, int64_t i) {
  std::string s;
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t dim = shape[d] > 0 ? shape[d] : 1;
    s = std::to_string(i % dim) + (s.empty() ? "" : ", ") + s;
    i /= dim;
  }
  return "[" + s + "]";
}

// Whether any of `n` values at `p` (words of `bits` bits, any alignment) has the exponent field
// `mask` all ones: one vectorisable pass, no early exit.
template <class Word>
bool AnyNonFinite(const uint8_t* p, int64_t n, Word mask) {
  unsigned bad = 0;
#pragma omp simd reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    Word w;
    std::memcpy(&w, p + static_cast<size_t>(i) * sizeof(Word), sizeof(Word));
    bad |= (w & mask) == mask ? 1u : 0u;
  }
  return bad != 0;
}

bool AnyNonFinite(const uint8_t* p, int64_t n, DType dt) {
  if (dt == DType::kF32) return AnyNonFinite<uint32_t>(p, n, 0x7f800000u);
  return AnyNonFinite<uint16_t>(p, n, dt == DType::kBF16 ? uint16_t{0x7f80} : uint16_t{0x7c00});
}

}  // namespace

// Blocks of 64K values checked in one vectorised pass each (on all threads for large tensors);
// only a block that holds a non-finite value is scanned again for its first index.
Status CheckFinite(const TensorView& t) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) return Status::Ok();
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t n = t.numel();
  const size_t es = DTypeSize(t.dtype);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<uint8_t> bad(static_cast<size_t>(blocks));
  ParallelFor(blocks, n >= (int64_t{1} << 20), [&](int64_t b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    bad[static_cast<size_t>(b)] = AnyNonFinite(t.data + static_cast<size_t>(i0) * es, len, t.dtype) ? 1 : 0;
  });
  int64_t first = n;
  for (int64_t b = 0; b < blocks && first == n; ++b) {
    if (!bad[static_cast<size_t>(b)]) continue;
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
      if (NonFiniteBits(t.data + static_cast<size_t>(i) * es, t.dtype)) {
        first = i;
        break;
      }
  }
  if (first == n) return Status::Ok();
  float v = 0;
  if (t.dtype == DType::kF32) std::memcpy(&v, t.data + static_cast<size_t>(first) * 4, 4);
  else {
    uint16_t h;
    std::memcpy(&h, t.data + static_cast<size_t>(first) * 2, 2);
    v = t.dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
  }
  return MakeErrorCode(ErrorCode::kCorruptInput, t.file, ": tensor \"", t.name, "\" holds ", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf",
                       " at index ", IndexString(t.shape, first), " (the first non-finite value; weights must be finite)");
}

Result<std::vector<float>> TensorToF32(const TensorView& t) {
  NIBBLE_RETURN_IF_ERROR(CheckFinite(t));
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), t.data, n * 4);
      break;
    case DType::kBF16:
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 20))
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = Bf16ToF32(h);
      }
      break;
    case DType::kF16:
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 20))
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = F16ToF32(h);
      }
      break;
    default:
      return MakeErrorCode(ErrorCode::kCorruptInput, t.file, ": tensor \"", t.name, "\" has dtype ", DTypeName(t.dtype),
                       ", expected a floating-point dtype (F32, F16 or BF16)");
  }
  return out;
}

Result<const TensorView*> GetShaped(const TensorStore& store, const std::string& name,
                                    const std::vector<int64_t>& expected_shape) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, store.Get(name));
  if (t->shape != expected_shape)
    return MakeErrorCode(ErrorCode::kCorruptInput, t->file, ": tensor \"", name, "\" has shape ", t->ShapeString(), ", expected ",
                     ShapeToString(expected_shape), " from config.json");
  return t;
}

Result<std::vector<float>> LoadF32(const TensorStore& store, const std::string& name,
                                   const std::vector<int64_t>& expected_shape) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(store, name, expected_shape));
  auto out = TensorToF32(*t);
  store.Release(*t);  // the fp32 copy is what the model keeps
  return out;
}

Result<std::shared_ptr<const Bf16Weights>> ShareBf16(const TensorStore& store, const std::string& name,
                                                     const std::vector<int64_t>& expected_shape) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(store, name, expected_shape));
  if (t->dtype != DType::kBF16)
    return MakeErrorCode(ErrorCode::kCorruptInput, t->file, ": tensor \"", name, "\" has dtype ", DTypeName(t->dtype),
                         ", expected BF16");
  NIBBLE_RETURN_IF_ERROR(CheckFinite(*t));
  auto w = std::make_shared<Bf16Weights>();
  w->count = static_cast<size_t>(t->numel());
  std::shared_ptr<const uint8_t> mapped = store.Share(*t);
  if (mapped != nullptr && reinterpret_cast<uintptr_t>(t->data) % 2 == 0) {
    w->values = reinterpret_cast<const uint16_t*>(t->data);
    w->owner = std::move(mapped);
  } else {
    // Not 2-byte aligned in the file (or not mapped): one copy, the mapping's pages released.
    auto copy = std::make_shared<std::vector<uint16_t>>(w->count);
    std::memcpy(copy->data(), t->data, t->nbytes);
    w->values = copy->data();
    w->owner = std::move(copy);
  }
  // CheckFinite read every page; later reads fault back in only what they touch.
  store.Release(*t);
  return std::shared_ptr<const Bf16Weights>(std::move(w));
}

}  // namespace nibble
