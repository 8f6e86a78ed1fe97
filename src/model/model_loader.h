// Loading a model directory of any supported format: the checkpoint format comes from the
// registry (formats/checkpoint_format.h); each linear module is resolved by the format, decoded
// into the native Int4Matrix and run as an Int4Linear, or loaded dense.
#pragma once

#include <memory>
#include <string>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "model/llama.h"

namespace nibble {

/// The loader for a checkpoint in `format` (nullptr: dense): quantized modules become
/// Int4Linear, the others dense; errors as QuantizedFormat::Import.
LinearLoader MakeLinearLoader(std::shared_ptr<const QuantizedFormat> format);

/// Checks, without converting any data, that `store` holds every tensor a model with config `c`
/// reads, with the shape config.json implies: embeddings, norms and biases as float tensors, each
/// linear as `format` stores it (nullptr: dense, float [N, K]). What `nibble generate` would refuse
/// at load, quantize and inspect refuse up front. Errors name the file, tensor, expected and found.
Status CheckCheckpointShapes(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format);

/// Loads a model directory of any supported format. `format_name` (optional) receives "dense" or
/// the format's name.
Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, std::string* format_name = nullptr);

}  // namespace nibble
