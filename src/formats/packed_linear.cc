// Checks and conversions shared by the AutoAWQ GEMM and GPTQ formats (see packed_linear.h).
#include "formats/packed_linear.h"

#include <cmath>
#include <cstring>

#include "formats/float_dtype.h"

namespace nibble {

std::string PackedTensorLabel(const TensorView& t) {
  return "tensor " + t.name + (t.file.empty() ? "" : " (" + t.file + ")");
}

std::string StoredTensorsOf(const TensorStore& store, const std::string& module) {
  std::string out;
  for (const std::string& name : store.Names()) {
    if (!name.starts_with(module + ".")) continue;
    const TensorView* t = store.Find(name);
    out += (out.empty() ? "" : ", ") + name + " " + DTypeName(t->dtype) + " " + t->ShapeString();
  }
  return out.empty() ? "none" : out;
}

Result<const TensorView*> GetPackedTensor(const TensorStore& store, const std::string& module, const std::string& suffix,
                                          bool want_float, const std::vector<int64_t>& shape, const std::string& layout) {
  const std::string name = module + "." + suffix;
  const std::string want = std::string(want_float ? "F16 (or F32, BF16)" : "I32") + " " + ShapeToString(shape);
  const std::string where = store.description().empty() ? "" : store.description() + ": ";
  const TensorView* t = store.Find(name);
  if (t == nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, "tensor ", name, ": missing; expected ", want, " (", layout,
                         "); stored for ", module, ": ", StoredTensorsOf(store, module));
  const bool dtype_ok = want_float ? IsFloatScaleDType(t->dtype) : t->dtype == DType::kI32;
  if (!dtype_ok || t->shape != shape)
    return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(*t), ": found ", DTypeName(t->dtype), " ",
                         t->ShapeString(), ", expected ", want, " (", layout, ")");
  if (t->nbytes != static_cast<size_t>(t->numel()) * DTypeSize(t->dtype) || (t->data == nullptr && t->nbytes != 0))
    return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(*t), ": holds ", t->nbytes, " bytes, expected ",
                         static_cast<size_t>(t->numel()) * DTypeSize(t->dtype));
  return t;
}

Status ReadGroupScales(const TensorView& t, Int4Matrix& m) {
  const int64_t n = m.n, G = m.groups();
  const size_t es = DTypeSize(t.dtype);
  m.scales.resize(static_cast<size_t>(n * G));
  for (int64_t gi = 0; gi < G; ++gi) {
    for (int64_t r = 0; r < n; ++r) {
      const float s = LoadFloatAs(t.data + static_cast<size_t>(gi * n + r) * es, t.dtype);
      if (!IsValidScale(s))
        return InvalidScaleError(PackedTensorLabel(t) + ": scale for group " + std::to_string(gi) + ", output " +
                                 std::to_string(r), s);
      m.scales[static_cast<size_t>(r * G + gi)] = s;
    }
  }
  return Status::Ok();
}

Result<TensorToWrite> WriteGroupScalesF16(const std::string& module, const Int4Matrix& m, const std::string& name) {
  const int64_t n = m.n, G = m.groups();
  TensorToWrite t;
  t.name = name;
  t.dtype = DType::kF16;
  t.shape = {G, n};
  t.bytes.resize(static_cast<size_t>(n * G) * 2);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const float s = m.scales[static_cast<size_t>(r * G + gi)];
      if (RoundToDType(s, DType::kF16) != s)
        return MakeErrorCode(ErrorCode::kUnsupported, module, ": scale[", r, "][", gi, "] = ", s,
                             " is not exactly representable in fp16, the only scale dtype of this format (the nearest "
                             "is ", RoundToDType(s, DType::kF16), "); quantize with fp16 scales or keep hf_format");
      StoreFloatAs(s, DType::kF16, t.bytes.data() + static_cast<size_t>(gi * n + r) * 2);
    }
  }
  return t;
}

Status CheckFloatModule(const TensorStore& store, const std::string& module, int64_t n, int64_t k,
                        const std::vector<std::string>& packed_suffixes, const std::string& format, const std::string& rule) {
  const std::string where = store.description().empty() ? "" : store.description() + ": ";
  for (const std::string& s : packed_suffixes)
    if (const TensorView* t = store.Find(module + "." + s))
      return MakeErrorCode(ErrorCode::kCorruptInput, where, "module ", module, " is kept in float by the ", format,
                           " config (", rule, ") but has the quantized tensor ", t->name, " ", DTypeName(t->dtype), " ",
                           t->ShapeString());
  const TensorView* w = store.Find(module + ".weight");
  if (w == nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, "tensor ", module, ".weight: missing; expected a float [", n, ", ",
                         k, "] weight (", format, " config: ", rule, "); stored for ", module, ": ",
                         StoredTensorsOf(store, module));
  if (w->shape != std::vector<int64_t>{n, k} || !IsFloatScaleDType(w->dtype))
    return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(*w), ": found ", DTypeName(w->dtype), " ",
                         w->ShapeString(), ", expected a float [", n, ", ", k, "] weight (", format, " config: ", rule, ")");
  return Status::Ok();
}

uint32_t PackedWord(const TensorView& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, t.data + i * 4, 4);
  return w;
}

void AppendWord(std::vector<uint8_t>& bytes, uint32_t w) {
  const size_t at = bytes.size();
  bytes.resize(at + 4);
  std::memcpy(bytes.data() + at, &w, 4);
}

namespace {

Error WrongType(const nlohmann::json& o, const std::string& key, const char* want, const std::string& where) {
  return MakeErrorCode(ErrorCode::kCorruptInput, where, ": key \"", key, "\": expected ", want, ", found ", o[key].dump());
}

}  // namespace

Result<std::optional<int64_t>> ConfigInt(const nlohmann::json& o, const std::string& key, const std::string& where) {
  if (!o.contains(key) || o[key].is_null()) return std::optional<int64_t>{};
  if (!o[key].is_number_integer()) return WrongType(o, key, "an integer", where);
  return std::optional<int64_t>(o[key].get<int64_t>());
}

Result<std::optional<bool>> ConfigBool(const nlohmann::json& o, const std::string& key, const std::string& where) {
  if (!o.contains(key) || o[key].is_null()) return std::optional<bool>{};
  if (!o[key].is_boolean()) return WrongType(o, key, "true or false", where);
  return std::optional<bool>(o[key].get<bool>());
}

Result<std::optional<std::string>> ConfigString(const nlohmann::json& o, const std::string& key, const std::string& where) {
  if (!o.contains(key) || o[key].is_null()) return std::optional<std::string>{};
  if (!o[key].is_string()) return WrongType(o, key, "a string", where);
  return std::optional<std::string>(o[key].get<std::string>());
}

Result<std::optional<int64_t>> ConfigIntEither(const nlohmann::json& o, const std::string& a, const std::string& b,
                                               const std::string& where) {
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> va, ConfigInt(o, a, where));
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> vb, ConfigInt(o, b, where));
  if (va && vb && *va != *vb)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, ": keys \"", a, "\" (", *va, ") and \"", b, "\" (", *vb,
                         ") are two spellings of one setting and disagree");
  return va ? va : vb;
}

Status CheckGroupSizeValue(int64_t g, const std::string& what) {
  if (g >= 1 || g == -1) return Status::Ok();
  return MakeErrorCode(ErrorCode::kCorruptInput, what, ": group_size ", g, " (expected a positive integer or -1)");
}

}  // namespace nibble
