#include "model/weights.h"

#include <cmath>
#include <cstring>
#include <string>

#include "base/half.h"

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

}  // namespace

Status CheckFinite(const TensorView& t) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) return Status::Ok();
  const int64_t n = t.numel();
  const size_t es = DTypeSize(t.dtype);
  int64_t first = n;
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= (int64_t{1} << 20))
  for (int64_t i = 0; i < n; ++i)
    if (NonFiniteBits(t.data + static_cast<size_t>(i) * es, t.dtype) && i < first) first = i;
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
  return TensorToF32(*t);
}

}  // namespace nibble
