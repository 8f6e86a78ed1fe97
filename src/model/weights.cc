#include "model/weights.h"

#include <cstring>

#include "base/half.h"

namespace nibble {

Result<std::vector<float>> TensorToF32(const TensorView& t) {
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
