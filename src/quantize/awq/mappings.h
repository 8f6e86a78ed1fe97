// An AWQ scaling_layers mapping resolved against the decoder layer's projections: which op is
// smoothed, which linears are balanced, whose input is the statistic, what module is inspected.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "quantize/awq/settings.h"
#include "quantize/pipeline.h"

namespace nibble {

/// The smooth layer of a mapping: an RMSNorm whose weight is divided by s, or a Linear whose last
/// len(s) output rows (and bias) are.
enum class AwqPrevOp { kInputLayernorm, kPostAttentionLayernorm, kLinear };

/// What a candidate's loss is measured on: the attention block, the MLP block, or the single
/// balance linear.
enum class AwqInspect { kSelfAttn, kMlp, kLinear };

struct ResolvedMapping {
  AwqMapping mapping;
  AwqPrevOp prev_op = AwqPrevOp::kInputLayernorm;
  int prev_linear = -1;       // LinearSlot when prev_op is kLinear
  std::vector<int> balance;   // LinearSlots
  LayerInput src = LayerInput::kAttnIn;  // input of the balance layers (the statistic)
  AwqInspect inspect = AwqInspect::kSelfAttn;
  int inspect_linear = -1;    // LinearSlot when inspect is kLinear
};

/// "prev_op -> layer/layer" for messages.
std::string Describe(const AwqMapping& m);

/// Errors name the mapping: an unknown layer, layers with different inputs, an inp that does not
/// take their input, an unsupported prev_op or one that does not feed the layers, a module2inspect
/// that does not contain them.
Result<ResolvedMapping> ResolveMapping(const AwqMapping& m);

/// Whether applying the mapping rescales input_layernorm or a q / k / v / o weight (its prev_op
/// or a balance layer): a layer's attention stages must then be recomputed.
bool ChangesAttention(const ResolvedMapping& r);

/// The linears whose weights or bias applying the mapping changes: its balance layers and a
/// prev_op linear.
std::vector<int> RescaledLinears(const ResolvedMapping& r);

/// How far a layer must run before the mapping's search: its statistic's input and, for the MLP
/// block, the MLP input.
LayerStop SearchStop(const ResolvedMapping& r);

}  // namespace nibble
