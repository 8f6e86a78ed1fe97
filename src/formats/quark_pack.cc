// Quark hf_format int4 pack / unpack (layout in quark_pack.h).
#include "formats/quark_pack.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "formats/float_dtype.h"

namespace nibble {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors words are little-endian; big-endian hosts unsupported");

constexpr int kReorderMap[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i holds element kReorderMap[i]
constexpr int kOrderMap[8] = {0, 1, 2, 3, 4, 5, 6, 7};

const int* OrderMap(PackMethod p) { return p == PackMethod::kReorder ? kReorderMap : kOrderMap; }

int64_t CeilDiv8(int64_t v) { return (v + 7) / 8; }

// Native code / zero point (0..15, int4 stored as q + 8) → stored nibble, and back. For int4 the
// stored nibble is the two's complement of q = u − 8, which is u XOR 8 (SPEC §1.5).
inline uint8_t ToStored(uint8_t u, bool int4) { return int4 ? static_cast<uint8_t>(u ^ 8u) : u; }
inline uint8_t FromStored(uint8_t nib, bool int4) { return int4 ? static_cast<uint8_t>(nib ^ 8u) : nib; }

inline uint32_t LoadWord(const uint8_t* base, int64_t idx) {
  uint32_t w;
  std::memcpy(&w, base + idx * 4, 4);
  return w;
}

// Packs a logical [rows, cols] grid of nibbles (get(r, c) ∈ 0..15) along cols into
// [rows, ceil(cols/8)] little-endian int32 words; padding nibbles are 0.
template <typename Get>
std::vector<uint8_t> PackGrid(int64_t rows, int64_t cols, PackMethod pack, Get get) {
  const int64_t words = CeilDiv8(cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * words * 4));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < words; ++c) {
      uint8_t nib[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t j = 0; j < 8 && 8 * c + j < cols; ++j) nib[j] = get(r, 8 * c + j);
      const uint32_t w = PackNibbleWord(nib, pack);
      std::memcpy(bytes.data() + (r * words + c) * 4, &w, 4);
    }
  }
  return bytes;
}

// Per-group weights: codes [N, K] (native, one per byte) → [K, ceil(N/8)] words packed along N.
// Through tiles of 128 outputs × 64 inputs, so that each code row is read in runs and each word
// row written whole (a nibble-by-nibble gather K bytes apart was most of RTN's packing time);
// the same words as PackGrid.
std::vector<uint8_t> PackTransposedCodes(const uint8_t* codes, int64_t n, int64_t k, PackMethod pack, bool int4) {
  constexpr int64_t kTileWords = 16, kTileK = 64, kPrefetchTiles = 4;
  const int64_t words = CeilDiv8(n);
  std::vector<uint8_t> bytes(static_cast<size_t>(k * words * 4));
  const int* map = OrderMap(pack);
  int shift[8];
  for (int i = 0; i < 8; ++i) shift[map[i]] = 4 * i;
  const uint32_t flip = int4 ? 8u : 0u;
  uint32_t tile[kTileK][kTileWords];
  uint32_t acc[kTileK];  // one word column of the tile, built along K (a vectorisable loop)
  for (int64_t c0 = 0; c0 < words; c0 += kTileWords) {
    const int64_t cw = std::min(kTileWords, words - c0);
    for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
      const int64_t kw = std::min(kTileK, k - k0);
      for (int64_t c = 0; c < cw; ++c) {
        std::memset(acc, 0, sizeof(acc));
        for (int j = 0; j < 8 && 8 * (c0 + c) + j < n; ++j) {
          const uint8_t* src = codes + (8 * (c0 + c) + j) * k + k0;
          __builtin_prefetch(src + kPrefetchTiles * kTileK);  // 128 rows at once: past what the prefetchers follow
          const int sh = shift[j];
          for (int64_t kk = 0; kk < kw; ++kk) acc[kk] |= (static_cast<uint32_t>(src[kk]) ^ flip) << sh;
        }
        for (int64_t kk = 0; kk < kw; ++kk) tile[kk][c] = acc[kk];
      }
      for (int64_t kk = 0; kk < kw; ++kk)
        std::memcpy(bytes.data() + ((k0 + kk) * words + c0) * 4, tile[kk], static_cast<size_t>(cw) * 4);
    }
  }
  return bytes;
}

// Unpacks [rows, ceil(cols/8)] words; calls put(r, c, nibble) for c < cols (padding skipped).
template <typename Put>
void UnpackGrid(const uint8_t* data, int64_t rows, int64_t cols, PackMethod pack, Put put) {
  const int64_t words = CeilDiv8(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < words; ++c) {
      uint8_t nib[8];
      UnpackNibbleWord(LoadWord(data, r * words + c), pack, nib);
      for (int64_t j = 0; j < 8 && 8 * c + j < cols; ++j) put(r, 8 * c + j, nib[j]);
    }
  }
}

// Per-group weights are stored transposed, [K, ceil(N/8)] words packed along N, while codes are
// [N, K]. Unpacks 64 × 64 tiles through a local buffer so that every write to codes is a 64-byte
// run of one row (a nibble-by-nibble scatter K bytes apart was most of a 1.1B model's load time).
void UnpackTransposedCodes(const uint8_t* data, int64_t k, int64_t n, PackMethod pack, bool int4, uint8_t* codes) {
  constexpr int64_t kTile = 64;  // a multiple of 8, so tiles start on word boundaries
  const int64_t words = CeilDiv8(n);
  const int* map = OrderMap(pack);
  // Blocks of K write disjoint columns of codes, so they run on all threads.
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 20))
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    uint8_t tile[kTile][kTile];  // [n - n0][k - k0]
    const int64_t kb = std::min(kTile, k - k0);
    for (int64_t n0 = 0; n0 < n; n0 += kTile) {
      const int64_t nb = std::min(kTile, n - n0);
      for (int64_t kk = 0; kk < kb; ++kk) {
        for (int64_t c = 0; c < nb; c += 8) {
          const uint32_t w = LoadWord(data, (k0 + kk) * words + (n0 + c) / 8);
          for (int i = 0; i < 8; ++i) {
            const int64_t nn = c + map[i];
            if (nn < nb) tile[nn][kk] = FromStored(static_cast<uint8_t>((w >> (4 * i)) & 0xFu), int4);
          }
        }
      }
      for (int64_t nn = 0; nn < nb; ++nn) std::memcpy(codes + (n0 + nn) * k + k0, tile[nn], static_cast<size_t>(kb));
    }
  }
}

std::string Layout(const WeightQuantSpec& spec, int64_t n, int64_t k) {
  std::string s = std::string("Quark ") + QuantDTypeName(spec.dtype) + " " + QSchemeName(spec.qscheme);
  if (spec.qscheme == QScheme::kPerGroup) s += " g=" + std::to_string(spec.EffectiveGroupSize(k));
  return s + ", N=" + std::to_string(n) + ", K=" + std::to_string(k);
}

std::string TensorLabel(const TensorView& t) {
  return "tensor " + t.name + (t.file.empty() ? "" : " (" + t.file + ")");
}

// Spec-only checks shared by shapes, export and import.
Status CheckSpec(const WeightQuantSpec& spec, const std::string& what) {
  if ((spec.dtype == QuantDType::kInt4) != spec.symmetric)
    return MakeErrorCode(ErrorCode::kUnsupported, what, ": dtype ", QuantDTypeName(spec.dtype), " with symmetric ", spec.symmetric ? "true" : "false",
                     " is not supported (expected int4 symmetric or uint4 asymmetric)");
  if (spec.group_size == 0 || spec.group_size < -1)
    return MakeError(what, ": invalid group_size ", spec.group_size, " (expected a positive integer or -1)");
  if (spec.qscheme == QScheme::kPerChannel && spec.group_size != -1)
    return MakeError(what, ": per_channel spec with group_size ", spec.group_size, " (expected -1)");
  return Status::Ok();
}

}  // namespace

uint32_t PackNibbleWord(const uint8_t nibbles[8], PackMethod pack) {
  const int* map = OrderMap(pack);
  uint32_t w = 0;
  for (int i = 0; i < 8; ++i) w |= static_cast<uint32_t>(nibbles[map[i]] & 0xFu) << (4 * i);
  return w;
}

void UnpackNibbleWord(uint32_t word, PackMethod pack, uint8_t nibbles[8]) {
  const int* map = OrderMap(pack);
  for (int i = 0; i < 8; ++i) nibbles[map[i]] = static_cast<uint8_t>((word >> (4 * i)) & 0xFu);
}

Result<QuarkTensorShapes> QuarkLinearShapes(const WeightQuantSpec& spec, int64_t n, int64_t k) {
  NIBBLE_RETURN_IF_ERROR(CheckSpec(spec, "Quark layout"));
  if (n < 1 || k < 1) return MakeError("Quark layout: shape N = ", n, ", K = ", k, " must have N >= 1 and K >= 1");
  const int64_t g = spec.EffectiveGroupSize(k);
  if (k % g != 0)
    return MakeError("Quark layout: input size K = ", k, " is not aligned with group_size ", g, " (N = ", n, ", K = ", k,
                     ", g = ", g, ")");
  if (n > INT64_MAX / k) return MakeError("Quark layout: N * K overflows (N = ", n, ", K = ", k, ")");
  QuarkTensorShapes s;
  if (spec.qscheme == QScheme::kPerGroup) {
    s.weight = {k, CeilDiv8(n)};
    s.weight_scale = {k / g, n};
    s.weight_zero_point = {k / g, CeilDiv8(n)};
  } else {
    s.weight = {n, CeilDiv8(k)};
    s.weight_scale = {n};
    s.weight_zero_point = {CeilDiv8(n)};
  }
  return s;
}

Result<QuarkLinearTensors> ExportQuarkLinear(const std::string& prefix, const Int4Matrix& m, const WeightQuantSpec& spec,
                                             PackMethod pack, DType scale_dtype) {
  NIBBLE_RETURN_IF_ERROR(ValidateInt4Matrix(m, prefix));
  NIBBLE_RETURN_IF_ERROR(CheckSpec(spec, prefix));
  if (!IsFloatScaleDType(scale_dtype))
    return MakeErrorCode(ErrorCode::kUnsupported, prefix, ": scale dtype ", DTypeName(scale_dtype), " is not supported (expected F32, F16 or BF16)");
  if (m.symmetric != spec.symmetric)
    return MakeError(prefix, ": matrix is ", m.symmetric ? "symmetric" : "asymmetric", " but the spec says ",
                     QuantDTypeName(spec.dtype), " symmetric=", spec.symmetric ? "true" : "false");
  if (m.group_size != spec.EffectiveGroupSize(m.k))
    return MakeError(prefix, ": matrix group size ", m.group_size, " does not match the spec's ",
                     spec.EffectiveGroupSize(m.k), " (group_size ", spec.group_size, ", K = ", m.k, ")");
  NIBBLE_ASSIGN_OR_RETURN(QuarkTensorShapes shapes, QuarkLinearShapes(spec, m.n, m.k));

  const bool int4 = spec.dtype == QuantDType::kInt4;
  const int64_t n = m.n, k = m.k, G = m.groups();
  QuarkLinearTensors t;
  t.weight.name = prefix + ".weight";
  t.weight.dtype = DType::kI32;
  t.weight.shape = shapes.weight;
  t.weight_zero_point.name = prefix + ".weight_zero_point";
  t.weight_zero_point.dtype = DType::kI32;
  t.weight_zero_point.shape = shapes.weight_zero_point;
  t.weight_scale.name = prefix + ".weight_scale";
  t.weight_scale.dtype = scale_dtype;
  t.weight_scale.shape = shapes.weight_scale;

  auto code = [&](int64_t r, int64_t c) { return ToStored(m.codes[static_cast<size_t>(r * k + c)], int4); };
  auto zero = [&](int64_t r, int64_t gi) { return ToStored(m.zero_points[static_cast<size_t>(r * G + gi)], int4); };
  if (spec.qscheme == QScheme::kPerGroup) {
    // Transposed: row = input k (or group), packed along outputs.
    t.weight.bytes = PackTransposedCodes(m.codes.data(), n, k, pack, int4);
    t.weight_zero_point.bytes = PackGrid(G, n, pack, [&](int64_t gi, int64_t nn) { return zero(nn, gi); });
  } else {
    t.weight.bytes = PackGrid(n, k, pack, code);
    t.weight_zero_point.bytes = PackGrid(1, n, pack, [&](int64_t, int64_t nn) { return zero(nn, 0); });
  }

  const size_t es = DTypeSize(scale_dtype);
  t.weight_scale.bytes.resize(static_cast<size_t>(n * G) * es);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const float s = m.scales[static_cast<size_t>(r * G + gi)];
      if (!std::isfinite(RoundToDType(s, scale_dtype)))
        return MakeError(prefix, ": scale[", r, "][", gi, "] = ", s, " overflows ", DTypeName(scale_dtype));
      // per_group scale is [G, N] (transposed); per_channel [N] (G == 1): same index gi * N + r.
      StoreFloatAs(s, scale_dtype, t.weight_scale.bytes.data() + static_cast<size_t>(gi * n + r) * es);
    }
  }
  return t;
}

namespace {

// The quantizer-submodule spelling of a flat suffix ("" for the weight, which has one spelling).
const char* QuantizerSpelling(const std::string& flat) {
  return flat == "weight_scale" ? "weight_quantizer.scale" : flat == "weight_zero_point" ? "weight_quantizer.zero_point" : "";
}

}  // namespace

const std::vector<std::string>& QuarkTensorSuffixes() {
  static const std::vector<std::string> s = {"weight", "weight_scale", "weight_zero_point", "weight_quantizer.scale",
                                             "weight_quantizer.zero_point"};
  return s;
}

Result<QuarkLinearViews> FindQuarkLinearViews(const TensorStore& store, const std::string& prefix) {
  QuarkLinearViews v;
  v.weight = store.Find(prefix + ".weight");
  const TensorView** slots[2] = {&v.weight_scale, &v.weight_zero_point};
  const char* flats[2] = {"weight_scale", "weight_zero_point"};
  for (int i = 0; i < 2; ++i) {
    const std::string a = prefix + "." + flats[i], b = prefix + "." + QuantizerSpelling(flats[i]);
    const TensorView* ta = store.Find(a);
    const TensorView* tb = store.Find(b);
    if (ta != nullptr && tb != nullptr)
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), store.description().empty() ? "" : ": ",
                           "tensors ", a, " and ", b, " are two spellings of one tensor; a checkpoint holds one of them");
    *slots[i] = ta != nullptr ? ta : tb;
  }
  return v;
}

Status CheckQuarkLinearTensors(const QuarkLinearViews& views, const std::string& prefix, const WeightQuantSpec& spec,
                               int64_t expected_n, int64_t expected_k) {
  NIBBLE_RETURN_IF_ERROR(CheckSpec(spec, prefix));
  auto shapes_or = QuarkLinearShapes(spec, expected_n, expected_k);
  if (!shapes_or.ok()) return shapes_or.error().WithContext(prefix);
  const QuarkTensorShapes& shapes = *shapes_or;
  const std::string layout = Layout(spec, expected_n, expected_k);

  struct Expect {
    const TensorView* view;
    const char* suffix;
    const std::vector<int64_t>* shape;
    bool is_float;
  };
  const Expect expects[3] = {{views.weight, ".weight", &shapes.weight, false},
                             {views.weight_scale, ".weight_scale", &shapes.weight_scale, true},
                             {views.weight_zero_point, ".weight_zero_point", &shapes.weight_zero_point, false}};
  for (const Expect& e : expects) {
    const std::string want_dtype = e.is_float ? "F32, F16 or BF16" : "I32";
    if (e.view == nullptr)
    {
      const std::string alt = QuantizerSpelling(e.suffix + 1);
      return MakeErrorCode(ErrorCode::kCorruptInput, "tensor ", prefix, e.suffix, ": missing; expected ", want_dtype, " ",
                           ShapeToString(*e.shape), " (", layout, ")",
                           alt.empty() ? std::string() : "; nor is it stored as " + prefix + "." + alt);
    }
    const TensorView& v = *e.view;
    const bool dtype_ok = e.is_float ? IsFloatScaleDType(v.dtype) : v.dtype == DType::kI32;
    if (!dtype_ok)
      return MakeErrorCode(ErrorCode::kCorruptInput, TensorLabel(v), ": dtype ", DTypeName(v.dtype), ", expected ", want_dtype, " (", layout, ")",
                       e.is_float ? "" : "; a float weight means weight_format fake_quantized or an unquantized layer");
    if (v.shape != *e.shape)
      return MakeErrorCode(ErrorCode::kCorruptInput, TensorLabel(v), ": shape ", v.ShapeString(), ", expected ", ShapeToString(*e.shape), " (", layout, ")");
    if (v.nbytes != static_cast<size_t>(v.numel()) * DTypeSize(v.dtype) || (v.data == nullptr && v.nbytes != 0))
      return MakeErrorCode(ErrorCode::kCorruptInput, TensorLabel(v), ": holds ", v.nbytes, " bytes, expected ", static_cast<size_t>(v.numel()) * DTypeSize(v.dtype));
  }
  return Status::Ok();
}

namespace {

// ImportQuarkLinear; a per_group layer's codes are left empty when `decode_codes` is false.
Result<Int4Matrix> ImportQuark(const QuarkLinearViews& views, const std::string& prefix, const WeightQuantSpec& spec,
                               PackMethod pack, int64_t expected_n, int64_t expected_k, bool decode_codes) {
  NIBBLE_RETURN_IF_ERROR(CheckQuarkLinearTensors(views, prefix, spec, expected_n, expected_k));
  const bool int4 = spec.dtype == QuantDType::kInt4;
  const int64_t n = expected_n, k = expected_k, g = spec.EffectiveGroupSize(k), G = k / g;
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = int4;
  if (decode_codes || spec.qscheme != QScheme::kPerGroup) m.codes.resize(static_cast<size_t>(n * k));
  m.scales.resize(static_cast<size_t>(n * G));
  m.zero_points.resize(static_cast<size_t>(n * G));

  auto set_code = [&](int64_t r, int64_t c, uint8_t nib) { m.codes[static_cast<size_t>(r * k + c)] = FromStored(nib, int4); };
  // Zero points: record the first bad int4 nibble (must be 0 = signed zero point 0).
  int64_t bad_group = -1, bad_out = -1;
  int bad_nib = 0;
  auto set_zero = [&](int64_t r, int64_t gi, uint8_t nib) {
    if (int4 && nib != 0 && bad_group < 0) {
      bad_group = gi;
      bad_out = r;
      bad_nib = nib;
    }
    m.zero_points[static_cast<size_t>(r * G + gi)] = FromStored(nib, int4);
  };
  const TensorView& wt = *views.weight;
  const TensorView& zt = *views.weight_zero_point;
  const TensorView& st = *views.weight_scale;
  if (spec.qscheme == QScheme::kPerGroup) {
    if (decode_codes) UnpackTransposedCodes(wt.data, k, n, pack, int4, m.codes.data());
    UnpackGrid(zt.data, G, n, pack, [&](int64_t gi, int64_t nn, uint8_t nib) { set_zero(nn, gi, nib); });
  } else {
    UnpackGrid(wt.data, n, k, pack, set_code);
    UnpackGrid(zt.data, 1, n, pack, [&](int64_t, int64_t nn, uint8_t nib) { set_zero(nn, 0, nib); });
  }
  if (bad_group >= 0)
    return MakeErrorCode(ErrorCode::kCorruptInput, TensorLabel(zt), ": zero point nibble ", bad_nib, " out of range for symmetric int4 (group ", bad_group,
                     ", output ", bad_out, "; expected 0: Quark int4 zero points are all 0)");

  const size_t es = DTypeSize(st.dtype);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const float s = LoadFloatAs(st.data + static_cast<size_t>(gi * n + r) * es, st.dtype);
      if (!IsValidScale(s))
        return InvalidScaleError(TensorLabel(st) + ": scale for group " + std::to_string(gi) + ", output " + std::to_string(r), s);
      m.scales[static_cast<size_t>(r * G + gi)] = s;
    }
  }
  return m;
}

}  // namespace

Result<Int4Matrix> ImportQuarkLinear(const QuarkLinearViews& views, const std::string& prefix, const WeightQuantSpec& spec,
                                     PackMethod pack, int64_t expected_n, int64_t expected_k) {
  return ImportQuark(views, prefix, spec, pack, expected_n, expected_k, true);
}

Result<std::optional<DeferredInt4>> ImportQuarkLinearDeferred(const QuarkLinearViews& views, const std::string& prefix,
                                                              const WeightQuantSpec& spec, PackMethod pack,
                                                              int64_t expected_n, int64_t expected_k) {
  if (spec.qscheme != QScheme::kPerGroup) return std::optional<DeferredInt4>{};
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, ImportQuark(views, prefix, spec, pack, expected_n, expected_k, false));
  DeferredInt4 d;
  d.matrix = std::move(m);
  d.codes.words = views.weight->data;
  std::copy_n(OrderMap(pack), 8, d.codes.order);
  d.codes.xor_mask = spec.dtype == QuantDType::kInt4 ? 8 : 0;
  return std::optional<DeferredInt4>(std::move(d));
}

Result<Int4Matrix> ImportQuarkLinear(const TensorStore& store, const std::string& prefix, const WeightQuantSpec& spec,
                                     PackMethod pack, int64_t expected_n, int64_t expected_k) {
  NIBBLE_ASSIGN_OR_RETURN(QuarkLinearViews views, FindQuarkLinearViews(store, prefix));
  auto r = ImportQuarkLinear(views, prefix, spec, pack, expected_n, expected_k);
  if (!r.ok() && !store.description().empty()) return r.error().WithContext(store.description());
  return r;
}

}  // namespace nibble
