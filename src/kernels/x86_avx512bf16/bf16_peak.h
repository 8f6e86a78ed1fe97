// The bf16 dot-product peak of one core: a loop of independent `vdpbf16ps` chains, no loads, so
// `nibble bench` can report the bf16 GEMM paths as a share of what the instruction allows (as
// the GEMV paths are reported against the measured read bandwidth). Call only where dispatch
// reports avx512_bf16 (kernels/int4_dispatch.h).
#pragma once

#include <cstdint>

namespace nibble {

/// Floating-point operations per loop iteration of Bf16DotPeakAvx512: 12 chains × 16 lanes × 2
/// bf16 pairs × (multiply + add).
constexpr int64_t kBf16DotPeakFlopsPerIter = 12 * 16 * 2 * 2;
/// Runs `iters` iterations; returns a sum of the accumulators (keeps the work observable).
float Bf16DotPeakAvx512(int64_t iters, float seed);

}  // namespace nibble
