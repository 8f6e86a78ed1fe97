// The dtype the calibration forward runs in (--calib_dtype), as llm-compressor and AutoAWQ run
// it on a GPU: the model's torch_dtype. In a 16-bit mode every linear of the calibration forward
// (and of AWQ's candidate forwards) multiplies x and W rounded to that dtype with fp32
// accumulation; norms, softmax and RoPE stay fp32 (as the runtime's bf16 activations); the
// captured linear inputs hold the rounded values, so Hessians and Gram matrices are fp32 sums of
// them; the layer input carried between layers is stored in the dtype. fp32 is the fp32 path.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "model/config.h"
#include "model/linear.h"

namespace nibble {

enum class CalibDType { kAuto, kBf16, kFp16, kFp32 };

/// "auto" | "bf16" | "fp16" | "fp32" (errors name `flag`, the value and the supported ones).
Result<CalibDType> ParseCalibDType(const std::string& text, const std::string& flag);
const char* CalibDTypeName(CalibDType t);
/// kAuto: the model's torch_dtype (bfloat16 → bf16, float16 → fp16, else fp32); others as given.
CalibDType ResolveCalibDType(CalibDType t, const ModelConfig& mc);

/// Bytes per element of the carried activations (a layer's input and output between layers):
/// 2 for bf16 / fp16, 4 for fp32.
int64_t CarriedActivationBytes(CalibDType t);

/// x[n] rounded to `t` in place (nothing for fp32). Precondition: t resolved (not kAuto).
void RoundActivations(float* x, int64_t n, CalibDType t);

/// Activations stored in the calibration dtype: fp32 as is, bf16 / fp16 as 16-bit patterns.
class CarriedActivations {
 public:
  explicit CarriedActivations(CalibDType t) : t_(t) {}
  /// Stores `v` (rounded for a 16-bit dtype; moved for fp32).
  void Store(std::vector<float>&& v);
  /// The values as fp32: fp32 storage itself, else widened (exactly) into `*wide`, and the 16-bit
  /// copy released (the caller's buffer holds the layer input from then on).
  const float* Take(std::vector<float>* wide);
  /// Values [offset, offset + n) as fp32 into out (exact), the storage kept.
  void Widen(int64_t offset, int64_t n, float* out) const;
  /// Storage for n values (zero), then Put fills [offset, offset + n) from fp32 (rounded for a
  /// 16-bit dtype): a layer output written chunk by chunk.
  void Resize(int64_t n);
  void Put(int64_t offset, const float* v, int64_t n);
  int64_t bytes() const;
  /// The stored values as raw bytes and their safetensors dtype ("F32", "BF16", "F16"): what a
  /// resumable run saves at a layer boundary (quantize/resume.h).
  std::span<const uint8_t> raw() const;
  const char* raw_dtype() const;
  /// Back from raw(): `dtype` must be this storage's and `bytes` hold `n` values. Errors
  /// (kCorruptInput) name both.
  Status Restore(std::span<const uint8_t> bytes, const std::string& dtype, int64_t n);

 private:
  CalibDType t_;
  std::vector<float> f32_;
  std::vector<uint16_t> h16_;
};

/// A linear of the calibration forward in dtype `t` (resolved): a DenseLinear for fp32; for bf16
/// the weights rounded to bf16 once here and each Forward a bf16 × bf16 GEMM with fp32
/// accumulation (oneDNN's bf16 matmul; the exact fp32 widening through the sgemm where the CPU
/// has none or a slower one); for fp16 x and W rounded to fp16 and multiplied exactly in the fp32 sgemm.
std::unique_ptr<Linear> MakeCalibLinear(int64_t n, int64_t k, std::shared_ptr<const std::vector<float>> w,
                                        std::vector<float> bias, CalibDType t);

/// Scratch a bf16 calibration linear [n, k] takes beyond its weights and its caller's rows where
/// oneDNN's bf16 matmul does not run (GemmBf16Usable false: no such kernel, or slower than the
/// fp32 sgemm): up to 512 rows of x and a weight tile, widened to fp32; 0 elsewhere.
int64_t CalibLinearWidenedBytes(int64_t n, int64_t k);

/// The bf16 calibration linear over bf16 bits the caller owns: w_bits [n, k] (row-major) must stay
/// alive and unchanged while the linear is used (AWQ's candidates, written into reused buffers).
std::unique_ptr<Linear> MakeBf16CalibLinearView(int64_t n, int64_t k, const uint16_t* w_bits, std::vector<float> bias);

}  // namespace nibble
