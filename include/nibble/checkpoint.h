// A checkpoint's linears read without loading the model, for checking a quantization: each
// linear with its resolved scheme, its weight dequantized to fp32 [N, K] exactly as `verify`
// compares it, and for an int4 linear its codes, scales, zero points and g_idx in the one
// convention every format is read into (SPEC Appendix A):
//   w[n][k] = (codes[n][k] - zero_points[n][g]) * scales[n][g],  g = g_idx[k] (or k / group_size).
// Codes and zero points are unsigned 0..15; a symmetric int4 code q is stored as q + 8 with every
// zero point 8. Works for every format nibble reads (dense included).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nibble/error.h>

namespace nibble {

struct CheckpointLinear {
  std::string name;  // "model.layers.0.self_attn.q_proj", ..., "lm_head"
  int64_t out_features = 0, in_features = 0;
  bool quantized = false;
  std::string scheme;  // "uint4 asym g128" (+ " g_idx"), or "float BF16" / "float BF16 (tied: ...)"
};

/// One int4 linear in the common convention above.
struct QuantizedWeight {
  int64_t out_features = 0, in_features = 0, group_size = 0;
  bool symmetric = false;
  std::vector<uint8_t> codes;        // [out_features, in_features]
  std::vector<float> scales;         // [out_features, in_features / group_size]
  std::vector<uint8_t> zero_points;  // [out_features, in_features / group_size]
  std::vector<int32_t> g_idx;        // [in_features], or empty: natural groups (k / group_size)
};

class Checkpoint {
 public:
  /// Opens `dir` with the loader's checks (config.json, tensors, quantization config). Errors:
  /// the loader's (kNotFound for a missing directory, kCorruptInput / kUnsupported for bad files).
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  ~Checkpoint();

  /// "dense" or the format's name ("quark", "compressed-tensors", "autoawq", "gptq").
  const std::string& format() const;
  /// Every linear in model order, with its scheme (reads each linear's tensors once).
  const std::vector<CheckpointLinear>& linears() const;
  /// The weight as the model uses it, fp32 [out_features, in_features]. Errors: an unknown name
  /// (kNotFound, naming it), the format's read errors.
  Result<std::vector<float>> Dequantize(const std::string& name) const;
  /// The int4 weight of `name`. Errors: an unknown name (kNotFound), a linear stored in float
  /// (kInvalidArgument, saying so), the format's read errors.
  Result<QuantizedWeight> Quantized(const std::string& name) const;

 private:
  struct Impl;
  Checkpoint();
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble
