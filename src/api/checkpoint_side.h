// A checkpoint directory opened for reading its linears as the model sees them, without loading
// the model: `verify` compares two of them, Checkpoint (<nibble/checkpoint.h>) exposes one.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "formats/checkpoint_format.h"
#include "formats/int4_matrix.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/output_projection.h"

namespace nibble {

struct CheckpointSide {
  std::unique_ptr<QuantizedFormat> format;  // nullptr: dense
  ModelConfig config;
  TensorStore store;
  OutputProjection proj;
  std::vector<std::string> linears;      // every linear; a tied lm_head is the embedding
  std::set<std::string> linear_tensors;  // every tensor a linear's weight is stored in
};

/// Opens `dir` and checks it as the loader does (config, shapes, the output projection).
Result<CheckpointSide> OpenCheckpointSide(const std::string& dir);

/// The int4 weight of `module` as the format stores it; nullopt when it is stored in float (or
/// is a tied lm_head).
Result<std::optional<Int4Matrix>> LinearInt4(const CheckpointSide& s, const std::string& module);

/// The float tensor of a linear not stored in int4 (a tied lm_head: the embedding), and how
/// it is stored ("float BF16", "float F32 (tied: model.embed_tokens.weight)").
Result<const TensorView*> FloatLinearTensor(const CheckpointSide& s, const std::string& module, std::string* how);

/// A linear's weight as the model uses it, fp32 [N, K] (dequantized with DequantizeRef, or the
/// float tensor), and how the side stores it ("uint4 asym g128", "float BF16").
Result<std::vector<float>> LinearWeight(const CheckpointSide& s, const std::string& module, std::string* how);

}  // namespace nibble
