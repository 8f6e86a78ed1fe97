// The ONNX decoder graph ONNX Runtime GenAI's model builder emits for a Llama-family model on the
// CPU execution provider, written from a checkpoint of any format nibble reads:
//
//   input_ids ─ Gather(embed_tokens) ─┬─ SimplifiedLayerNormalization ─ q/k/v ─ GroupQueryAttention
//                                     │   (rotary inside, cos/sin caches)  ─ o_proj
//   per layer: SkipSimplifiedLayerNormalization (residual sums) ─ gate/up ─ SiLU·up ─ down_proj
//   final SkipSimplifiedLayerNormalization ─ lm_head ─ logits
//
// Every quantized linear is a com.microsoft.MatMulNBits with its own block size (its group size,
// formats/matmul_nbits.h); float linears are MatMul over the transposed weight [K, N]; q/k/v and
// other biases are Add nodes. attention_mask gives GroupQueryAttention's seqlens_k
// (ReduceSum − 1) and total_sequence_length (its second dimension). Inputs and outputs carry the
// builder's names: input_ids, attention_mask, past_key_values.{i}.key / .value, logits,
// present.{i}.key / .value (KV [batch, kv_heads, sequence, head_size]).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nibble/cancel.h>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "onnx/onnx_writer.h"

namespace nibble {

struct DecoderGraphOptions {
  int64_t accuracy_level = 4;  // MatMulNBits accuracy_level (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8)
  DType io_dtype = DType::kF32;  // activations, KV cache, scales and float weights: F32 or F16
  /// Checked before each decoder layer and each linear: cancelled, WriteDecoderGraph returns
  /// kCancelled (the caller's staging directory holds a partial graph and is discarded).
  const CancellationToken* cancel = nullptr;
};

struct DecoderGraphStats {
  int64_t matmul_nbits = 0, matmul_float = 0;
  std::map<std::string, int64_t> block_size;  // module -> MatMulNBits block_size
};

/// Checks, before anything is written, what the graph cannot express: every quantized linear's
/// group size (MatMulNBits block sizes), and the config's features. Errors name the layer / key.
Status CheckDecoderGraph(const ModelConfig& c, const QuantizedFormat* format, const DecoderGraphOptions& o);

/// Writes the graph and its weights (streamed to the writer's data file) for the checkpoint
/// `store` of config `c` in `format` (nullptr: dense). Errors name the module or tensor.
Result<DecoderGraphStats> WriteDecoderGraph(const ModelConfig& c, const TensorStore& store,
                                            const QuantizedFormat* format, const DecoderGraphOptions& o,
                                            OnnxWriter& w);

/// Registers, once, the schema of the one contrib op ONNX Runtime defines in the default ONNX
/// domain (SimplifiedLayerNormalization), so onnx::checker can check the graph.
void RegisterContribSchemasForChecker();

}  // namespace nibble
