// Reading fp tensors of a checkpoint into fp32, with shape and dtype checks that name the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "io/safetensors.h"
#include "model/linear.h"

namespace nibble {

/// Checks that a F32 / F16 / BF16 tensor holds no inf or NaN (other dtypes: Ok). Errors name the
/// file, the tensor, the value and the index of the first one, e.g. `tensor "x" holds nan at index
/// [3, 17]`.
Status CheckFinite(const TensorView& t);

/// Converts a F32 / F16 / BF16 tensor to fp32 (exact). Errors: other dtypes (names tensor+file),
/// non-finite values (CheckFinite).
Result<std::vector<float>> TensorToF32(const TensorView& t);

/// The tensor `name` from `store`, checked to have `expected_shape` (from config.json).
/// Errors: missing tensor, or shape mismatch (names the file, tensor, both shapes).
Result<const TensorView*> GetShaped(const TensorStore& store, const std::string& name,
                                    const std::vector<int64_t>& expected_shape);

/// Looks up `name`, checks its shape equals `expected_shape` and converts it to fp32; the
/// store's resident pages of the tensor are released after the copy (TensorStore::Release).
/// Errors: missing tensor, shape mismatch (expected vs found), non-float dtype.
Result<std::vector<float>> LoadF32(const TensorStore& store, const std::string& name,
                                   const std::vector<int64_t>& expected_shape);

/// A BF16 tensor `name` of `expected_shape`, checked finite, served zero-copy from the store's
/// mapping (a copy only when the file stores it at an odd address); its resident pages are
/// released after the check, so later reads fault in only the rows they touch.
/// Errors: as LoadF32, and a dtype other than BF16.
Result<std::shared_ptr<const Bf16Weights>> ShareBf16(const TensorStore& store, const std::string& name,
                                                     const std::vector<int64_t>& expected_shape);

}  // namespace nibble
