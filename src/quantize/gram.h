// The Gram matrix XᵀX of a linear's calibration inputs: AWQ scores candidates through it and
// GPTQ's Hessian is it, scaled.
#pragma once

#include <cstdint>
#include <vector>

namespace nibble {

/// How much of G is computed: every element (each of G[i][j] and G[j][i] from its own product,
/// which may differ in the last bit), or the lower triangle with the upper mirrored from it
/// (exactly symmetric, half the arithmetic).
enum class GramFill { kFull, kLowerMirrored };

/// G = XᵀX [k, k] for x [rows, k]. Each 64-column block of G is the double sum, in chunk order,
/// of fp32 products over fixed 2048-row chunks (rounded to fp32 at the end): blocks run in
/// parallel, and every element's arithmetic is the same for any thread count. Where every x is a
/// bf16 value (a bf16 calibration's captures) and the CPU has a bf16 matmul, the chunk products
/// run as bf16 × bf16 with fp32 sums (the same exact products, other rounding of the sums) on
/// parts of at most 2k rows, each part's double sums rounded to fp32 and added into G in order; a
/// transposed bf16 copy of one part (no larger than G) is held meanwhile.
std::vector<float> GramMatrix(const float* x, int64_t rows, int64_t k, GramFill fill = GramFill::kFull);

/// g [k, k] += XᵀX of x [rows, k] on and below the diagonal (in square tiles of a size fixed by
/// k; the diagonal tiles whole, so some elements above it too): one fp32 sgemm per tile into g,
/// the tiles in parallel, so a sum over chunks of rows added in a fixed order is the same for any
/// thread count. Bf16-valued x with a bf16 matmul on this CPU: each tile one bf16 × bf16 matmul
/// (exact products, fp32 sums) added into g, from a transposed bf16 copy of x held meanwhile.
/// MirrorLower then makes g symmetric.
void AccumulateGramLower(const float* x, int64_t rows, int64_t k, float* g);
/// g [k, k]: every element above the diagonal set to its mirror below it.
void MirrorLower(float* g, int64_t k);

}  // namespace nibble
