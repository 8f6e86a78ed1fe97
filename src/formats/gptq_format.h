// GPTQ checkpoints (quant_method "gptq"; AutoGPTQ / GPTQModel; SPEC §3.2, §9.1, §9.4) as a
// registry entry (formats/checkpoint_format.h).
//
// Layout per quantized linear P (N = out_features, K = in_features, g = group_size, G = K / g):
//   P.qweight  int32 [K / 8, N]  word (r, n) holds the codes of inputs 8r..8r+7 of output n
//   P.qzeros   int32 [G, N / 8]  word (i, c) holds the zero points of outputs 8c..8c+7, group i
//   P.scales   fp16  [G, N]
//   P.g_idx    int32 [K]         group of each input column (optional when desc_act is false)
//   P.bias     optional, float [N]
// Nibble order: sequential (PackMethod::kOrder), element j of a run of 8 at bits 4j..4j+3.
// checkpoint_format "gptq" (v1, the default) stores z − 1 in each zero nibble, "gptq_v2" stores z.
// A v1 nibble 15 (z = 16) cannot come from a valid v1 writer: the word arithmetic of a z = 0
// borrows into the next nibble (SPEC §7 TV-1, §9.1), so such a file is refused rather than
// guessed at. sym true: every effective zero must be 8.
// Config: bits (4), group_size (−1 = one group per row), desc_act, sym, checkpoint_format (or
// GPTQModel's "format"), lm_head, dynamic (per-module overrides in key order, first match wins:
// "-:regex" keeps the module float, "+:regex" or a bare regex overrides bits / group_size / sym /
// desc_act; Python re.match semantics, anchored at the start of the full module name). When
// quantize_config.json sits next to config.json, every key both hold must agree.
// Writing: v1 or v2, fp16 scales, the most common (group_size, sym) as the global spec and the
// others as exact-name "+:" dynamic entries, float linears as exact-name "-:" entries (a GPTQ
// config has no exclude list); quantize_config.json holds the same object.
#pragma once

#include "formats/checkpoint_format.h"

namespace nibble {

/// The registry entry ("gptq", --model_export gptq).
const FormatEntry& GptqFormatEntry();

/// `name` as a regex matching exactly that text ("model\.layers\.0\.mlp\.up_proj").
std::string RegexEscape(const std::string& name);

}  // namespace nibble
