// The Gram matrix XᵀX of a linear's calibration inputs: AWQ scores candidates through it and
// GPTQ's Hessian is it, scaled.
#pragma once

#include <cstdint>
#include <vector>

namespace nibble {

/// G = XᵀX [k, k] for x [rows, k]. Each 64-column block of G is the double sum, in chunk order,
/// of fp32 products over fixed 2048-row chunks (rounded to fp32 at the end): blocks run in
/// parallel, and every element's arithmetic is the same for any thread count.
std::vector<float> GramMatrix(const float* x, int64_t rows, int64_t k);

}  // namespace nibble
