// genai_config.json: what ONNX Runtime GenAI reads to run the decoder graph (onnx/decoder_graph.h),
// with the keys and defaults its model builder writes (src/config.cpp names them).
#pragma once

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace nibble {

/// From the model's config and its parsed config.json / generation_config.json (the latter an
/// empty object when absent): token ids, context length (max_position_embeddings), the decoder's
/// shape and I/O names, and search defaults (greedy unless generation_config.json samples).
nlohmann::ordered_json GenaiConfig(const ModelConfig& c, const nlohmann::json& config_json,
                                   const nlohmann::json& generation_config);

}  // namespace nibble
