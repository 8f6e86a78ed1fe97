// The terms of a quantize run's memory model (quantize/resource_plan.h): what one decoder layer of
// the calibrated pipeline holds, and the phases in which an algorithm adds its own buffers
// (AlgorithmSettings::MemoryPhases: GPTQ's Hessians, AWQ's candidates). Sizes in bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace nibble {

/// One buffer (or a group of equal ones) the model counts: "GPTQ Hessian of model.layers.0.mlp.down_proj
/// 28672x28672 fp32 and its damped copy".
struct MemoryTerm {
  std::string what;
  int64_t bytes = 0;
};

/// The buffers live at one point of a run; the plan's peak is the largest phase.
struct MemoryPhase {
  std::string name;  // "GPTQ Hessian (model.layers.0.mlp.down_proj)"
  std::vector<MemoryTerm> terms;
  int64_t Total() const {
    int64_t t = 0;
    for (const MemoryTerm& m : terms) t += m.bytes;
    return t;
  }
};

/// A decoder layer as the calibrated pipeline holds it, for an algorithm's MemoryPhases: the
/// shapes in LinearSlot order (quantize/pipeline.h) and the calibration rows.
struct LayerMemoryShape {
  std::string name;  // "model.layers.0"
  int64_t batch = 0, seq_len = 0, rows = 0;  // calibration sequences, tokens each, rows = batch · seq_len
  int64_t hidden = 0, q_dim = 0, kv_dim = 0, intermediate = 0;
  int64_t act_bytes = 0;  // kCalibActBytes
  int threads = 1;
  /// The layer runs in chunks of chunk_rows rows (AlgorithmPlan::ChunkedLayers): Gram matrices
  /// and 16-bit rows instead of activations over all rows; `grams`: its fp pass accumulates the
  /// Gram matrices of the quantized linears' inputs (AlgorithmPlan::NeedsGrams).
  bool chunked = false, grams = false;
  /// A bf16 calibration (else fp16 or fp32): AWQ's candidate weights of a chunked layer are bf16.
  bool bf16 = false;
  int64_t chunk_rows = 0;
  std::array<int64_t, 7> n{}, k{}, groups{};  // groups: scale groups per row (0 when kept in float)
  std::array<bool, 7> quantized{};
  std::array<std::string, 7> linear;  // module names
  /// Buffers every phase of the layer holds (its weights, the original copy, the activations, ...).
  std::vector<MemoryTerm> base;

  /// fp32 bytes of linear `i`'s weight.
  int64_t WeightBytes(int i) const { return n[i] * k[i] * 4; }
  /// An Int4Matrix of linear `i`: one byte per code, fp32 scales and a byte per zero point per group.
  int64_t CodesBytes(int i) const { return quantized[i] ? n[i] * k[i] + n[i] * groups[i] * 5 : 0; }
  /// Bytes of one row of every capture point of LayerActs (attn_in, attn_concat, attn_residual,
  /// mlp_in, mlp_act, out).
  int64_t ActsRowBytes() const { return (4 * hidden + q_dim + intermediate) * act_bytes; }
  /// fp32 forward scratch per row (model/workspace.h): the block output, q, k, v, gate and up; the
  /// attention output too when it is not captured (`captured` false: AWQ's inspected modules).
  int64_t ScratchRowBytes(bool captured = true) const {
    return (hidden + (captured ? 1 : 2) * q_dim + 2 * kv_dim + 2 * intermediate) * 4;
  }
};

/// "28672x28672".
inline std::string Dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

}  // namespace nibble
