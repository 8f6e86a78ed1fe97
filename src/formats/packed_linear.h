// What AutoAWQ GEMM and GPTQ checkpoints share: int32 words of 4-bit nibbles, fp16 scales stored
// [G, N] (rows = groups, columns = outputs), a float `weight` for the modules kept in float, and
// a flat `quantization_config` object of a few typed keys. The two formats differ in which
// dimension the codes are packed along and in the nibble order (formats/autoawq_format.h,
// formats/gptq_format.h); this file holds the checks and conversions that do not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "formats/int4_matrix.h"
#include "io/safetensors.h"

namespace nibble {

/// "tensor P.qweight (file)" for messages.
std::string PackedTensorLabel(const TensorView& t);

/// The tensor `name` of `store` with dtype I32 (want_float false) or F32/F16/BF16 (true) and
/// exactly `shape`. Errors (kCorruptInput) name the file, the tensor, what `layout` expects and
/// what was found; a missing tensor lists the module's stored tensors (`module`), which tells a
/// checkpoint of another format apart ("found P.weight I32, P.weight_scale").
Result<const TensorView*> GetPackedTensor(const TensorStore& store, const std::string& module, const std::string& suffix,
                                          bool want_float, const std::vector<int64_t>& shape, const std::string& layout);

/// The stored tensors of `module` ("P.weight F16 [8, 16], P.qweight I32 [2, 16]") for messages.
std::string StoredTensorsOf(const TensorStore& store, const std::string& module);

/// Reads scales [G, N] (any float dtype, converted exactly) into m.scales [N, G]. Errors name
/// the tensor, group and output of the first non-finite or negative scale.
Status ReadGroupScales(const TensorView& t, Int4Matrix& m);

/// m.scales as an fp16 tensor `name` [G, N]. Errors (kUnsupported) name the layer, row, group and
/// value of a scale fp16 does not hold exactly (quantize computes fp16 scales for these formats;
/// a converted fp32 or bf16 scale may not fit).
Result<TensorToWrite> WriteGroupScalesF16(const std::string& module, const Int4Matrix& m, const std::string& name);

/// A module the config keeps in float: its stored `weight` must be float [n, k] and none of
/// `packed_suffixes` may be stored. `format` and `rule` name the format and the config rule.
Status CheckFloatModule(const TensorStore& store, const std::string& module, int64_t n, int64_t k,
                        const std::vector<std::string>& packed_suffixes, const std::string& format, const std::string& rule);

/// The 32-bit word i of an I32 tensor (little-endian).
uint32_t PackedWord(const TensorView& t, int64_t i);
/// Appends `w` to `bytes` as 4 little-endian bytes.
void AppendWord(std::vector<uint8_t>& bytes, uint32_t w);

/// Typed keys of a quantization_config object (`where` names the file in errors): nullopt when
/// absent or null; an error naming the key, the expected type and the value otherwise.
Result<std::optional<int64_t>> ConfigInt(const nlohmann::json& o, const std::string& key, const std::string& where);
Result<std::optional<bool>> ConfigBool(const nlohmann::json& o, const std::string& key, const std::string& where);
Result<std::optional<std::string>> ConfigString(const nlohmann::json& o, const std::string& key, const std::string& where);
/// One of two spellings of a key (AutoAWQ's w_bit / bits); both present with different values is
/// an error naming both.
Result<std::optional<int64_t>> ConfigIntEither(const nlohmann::json& o, const std::string& a, const std::string& b,
                                               const std::string& where);
/// A group_size value: a positive integer or −1 (one group per row). Errors name `what`.
Status CheckGroupSizeValue(int64_t g, const std::string& what);

}  // namespace nibble
