// Calibration in the model's dtype (see calib_dtype.h).
#include "quantize/calib_dtype.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "formats/float_dtype.h"
#include "kernels/bf16_gemv.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_packed.h"

namespace nibble {

Result<CalibDType> ParseCalibDType(const std::string& text, const std::string& flag) {
  if (text == "auto") return CalibDType::kAuto;
  if (text == "bf16") return CalibDType::kBf16;
  if (text == "fp16") return CalibDType::kFp16;
  if (text == "fp32") return CalibDType::kFp32;
  return MakeErrorCode(ErrorCode::kUnsupported, flag, " \"", text, "\" is not supported (supported: auto, bf16, fp16, fp32)");
}

const char* CalibDTypeName(CalibDType t) {
  switch (t) {
    case CalibDType::kAuto: return "auto";
    case CalibDType::kBf16: return "bf16";
    case CalibDType::kFp16: return "fp16";
    default: return "fp32";
  }
}

CalibDType ResolveCalibDType(CalibDType t, const ModelConfig& mc) {
  if (t != CalibDType::kAuto) return t;
  if (mc.torch_dtype == "bfloat16") return CalibDType::kBf16;
  if (mc.torch_dtype == "float16") return CalibDType::kFp16;
  return CalibDType::kFp32;
}

int64_t CarriedActivationBytes(CalibDType t) { return t == CalibDType::kFp32 ? 4 : 2; }

void RoundActivations(float* x, int64_t n, CalibDType t) {
  NIBBLE_CHECK(t != CalibDType::kAuto);
  if (t == CalibDType::kBf16) {
    RoundToBf16(x, n, x);
  } else if (t == CalibDType::kFp16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] = RoundToDType(x[i], DType::kF16);
  }
}

void CarriedActivations::Store(std::vector<float>&& v) {
  NIBBLE_CHECK(t_ != CalibDType::kAuto);
  if (t_ == CalibDType::kFp32) {
    f32_ = std::move(v);
    return;
  }
  h16_.resize(v.size());
  const int64_t n = static_cast<int64_t>(v.size());
  if (t_ == CalibDType::kBf16) {
    ToBf16Bits(v.data(), n, h16_.data());
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) h16_[i] = F32ToF16(v[i]);
  }
}

const float* CarriedActivations::Take(std::vector<float>* wide) {
  if (t_ == CalibDType::kFp32) return f32_.data();
  const int64_t n = static_cast<int64_t>(h16_.size());
  wide->resize(h16_.size());
  if (t_ == CalibDType::kBf16) {
    Bf16ToF32Rows(h16_.data(), 1, n, wide->data());
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) (*wide)[i] = F16ToF32(h16_[i]);
  }
  std::vector<uint16_t>().swap(h16_);
  return wide->data();
}

void CarriedActivations::Widen(int64_t offset, int64_t n, float* out) const {
  if (t_ == CalibDType::kFp32) {
    std::memcpy(out, f32_.data() + offset, static_cast<size_t>(n) * sizeof(float));
  } else if (t_ == CalibDType::kBf16) {
    Bf16ToF32Rows(h16_.data() + offset, 1, n, out);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(h16_[offset + i]);
  }
}

void CarriedActivations::Resize(int64_t n) {
  NIBBLE_CHECK(t_ != CalibDType::kAuto);
  if (t_ == CalibDType::kFp32) f32_.assign(static_cast<size_t>(n), 0.0f);
  else h16_.assign(static_cast<size_t>(n), 0);
}

void CarriedActivations::Put(int64_t offset, const float* v, int64_t n) {
  if (t_ == CalibDType::kFp32) {
    std::memcpy(f32_.data() + offset, v, static_cast<size_t>(n) * sizeof(float));
  } else if (t_ == CalibDType::kBf16) {
    ToBf16Bits(v, n, h16_.data() + offset);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) h16_[offset + i] = F32ToF16(v[i]);
  }
}

int64_t CarriedActivations::bytes() const {
  return static_cast<int64_t>(f32_.size() * sizeof(float) + h16_.size() * sizeof(uint16_t));
}

std::span<const uint8_t> CarriedActivations::raw() const {
  if (t_ == CalibDType::kFp32) return {reinterpret_cast<const uint8_t*>(f32_.data()), f32_.size() * sizeof(float)};
  return {reinterpret_cast<const uint8_t*>(h16_.data()), h16_.size() * sizeof(uint16_t)};
}

const char* CarriedActivations::raw_dtype() const {
  return t_ == CalibDType::kFp32 ? "F32" : t_ == CalibDType::kBf16 ? "BF16" : "F16";
}

Status CarriedActivations::Restore(std::span<const uint8_t> bytes, const std::string& dtype, int64_t n) {
  const size_t elt = t_ == CalibDType::kFp32 ? sizeof(float) : sizeof(uint16_t);
  if (dtype != raw_dtype() || bytes.size() != static_cast<size_t>(n) * elt)
    return MakeErrorCode(ErrorCode::kCorruptInput, "the saved calibration activations are ", bytes.size(), " bytes of ", dtype,
                         ", expected ", n, " values of ", raw_dtype());
  if (t_ == CalibDType::kFp32) {
    f32_.resize(static_cast<size_t>(n));
    std::memcpy(f32_.data(), bytes.data(), bytes.size());
  } else {
    h16_.resize(static_cast<size_t>(n));
    std::memcpy(h16_.data(), bytes.data(), bytes.size());
  }
  return Status::Ok();
}

namespace {

// bf16 × bf16 → fp32 linear: W rounded to bf16 bits at construction (or bits the caller owns).
class Bf16CalibLinear final : public Linear {
 public:
  Bf16CalibLinear(int64_t n, int64_t k, const std::vector<float>& w, std::vector<float> bias)
      : n_(n), k_(k), own_(static_cast<size_t>(n * k)), w_(own_.data()), bias_(std::move(bias)) {
    ToBf16Bits(w.data(), n * k, own_.data());
  }
  Bf16CalibLinear(int64_t n, int64_t k, const uint16_t* w_bits, std::vector<float> bias)
      : n_(n), k_(k), w_(w_bits), bias_(std::move(bias)) {}
  int64_t in_features() const override { return k_; }
  int64_t out_features() const override { return n_; }
  using Linear::Forward;
  void Forward(const float* x, int64_t m, float* y, Workspace* ws) const override {
    Workspace local;
    Workspace& w = ws != nullptr ? *ws : local;
    if (GemmBf16Usable(n_, k_)) {
      uint16_t* const xb = w.Get<uint16_t>(Workspace::Slot::kLinearRows, m * k_);
      ToBf16Bits(x, m * k_, xb);
      NIBBLE_CHECK(GemmBf16XWt(m, n_, k_, xb, w_, y));
    } else {
      // No bf16 matmul on this CPU, or a slower one (GemmBf16Usable).
      SgemmWidenedBf16(x, m, n_, k_, true, [&](int64_t n0, int64_t) { return w_ + n0 * k_; }, y, w);
    }
    if (!bias_.empty()) AddBiasRows(y, m, n_, bias_.data());
  }
  std::string Describe() const override { return "calibration bf16"; }
  int64_t WeightBytes() const override { return n_ * k_ * 2; }

 private:
  int64_t n_, k_;
  std::vector<uint16_t> own_;
  const uint16_t* w_;  // own_ or the caller's bits
  std::vector<float> bias_;
};

// fp16: x and W rounded to fp16 (the products of two fp16 values are exact in fp32).
class Fp16CalibLinear final : public Linear {
 public:
  Fp16CalibLinear(int64_t n, int64_t k, const std::vector<float>& w, std::vector<float> bias)
      : n_(n), k_(k), w_(w), bias_(std::move(bias)) {
    RoundActivations(w_.data(), n * k, CalibDType::kFp16);
  }
  int64_t in_features() const override { return k_; }
  int64_t out_features() const override { return n_; }
  using Linear::Forward;
  void Forward(const float* x, int64_t m, float* y, Workspace* ws) const override {
    Workspace local;
    Workspace& w = ws != nullptr ? *ws : local;
    float* const xr = w.Get<float>(Workspace::Slot::kLinearRows, m * k_);
    for (int64_t i = 0; i < m * k_; ++i) xr[i] = RoundToDType(x[i], DType::kF16);
    SgemmXWtTiled(m, n_, k_, xr, k_, w_.data(), k_, y, n_);
    if (!bias_.empty()) AddBiasRows(y, m, n_, bias_.data());
  }
  std::string Describe() const override { return "calibration fp16"; }
  int64_t WeightBytes() const override { return n_ * k_ * 4; }

 private:
  int64_t n_, k_;
  std::vector<float> w_;
  std::vector<float> bias_;
};

}  // namespace

int64_t CalibLinearWidenedBytes(int64_t n, int64_t k) {
  if (GemmBf16Usable(n, k)) return 0;
  return (kWidenedRows + LinearTileRows(n, k, 4)) * k * 4;  // SgemmWidenedBf16's scratch
}

std::unique_ptr<Linear> MakeCalibLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<float>> w,
                                        std::vector<float> bias, CalibDType t) {
  NIBBLE_CHECK(t != CalibDType::kAuto);
  if (t == CalibDType::kBf16) return std::make_unique<Bf16CalibLinear>(n, k, *w, std::move(bias));
  if (t == CalibDType::kFp16) return std::make_unique<Fp16CalibLinear>(n, k, *w, std::move(bias));
  return std::make_unique<DenseLinear>(n, k, std::move(w), std::move(bias));
}

std::unique_ptr<Linear> MakeBf16CalibLinearView(int64_t n, int64_t k, const uint16_t* w_bits, std::vector<float> bias) {
  return std::make_unique<Bf16CalibLinear>(n, k, w_bits, std::move(bias));
}

}  // namespace nibble
