// The arithmetic of the vectorised row ops (kernels/vec_ops.h), written once and included by each
// ISA's translation unit (kernels/vec_ops.cc, x86_avx2/, x86_avx512/), which compiles it with its
// own -m flags plus -ffp-contract=off (no FMA contraction, so every ISA rounds the same) and
// -fno-trapping-math (ExpF's clamps then if-convert and the loops vectorise); CMakeLists.txt sets
// both. Reductions are written on 16- / 8-lane GCC vectors, which each ISA splits into its own
// registers: the lane structure, and so the bits, do not depend on the vector width. Internal
// linkage, so each unit keeps its own copy built with its own flags.
#pragma once

#include <cstdint>

#include "kernels/exp_f.h"
#include "kernels/vec_ops.h"

namespace nibble {
namespace {

void ExpShiftedImpl(float* row, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) row[i] = ExpF(row[i] + shift);
}

void ScaledSoftmaxRowImpl(float* row, int64_t valid, int64_t len, float scale) {
  // 16 lanes as one GCC vector: written as an array of 16 floats, GCC kept these reductions scalar.
  typedef float Lanes __attribute__((vector_size(64)));
  constexpr int kLanes = 16;
  for (int64_t i = 0; i < valid; ++i) row[i] *= scale;
  Lanes lane_max = Lanes{} - 3.0e38f;
  int64_t j = 0;
  for (; j + kLanes <= valid; j += kLanes) {
    Lanes v;
    __builtin_memcpy(&v, row + j, sizeof(v));
    lane_max = v > lane_max ? v : lane_max;
  }
  float mx = -3.0e38f;
  for (; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
  for (int l = 0; l < kLanes; ++l) mx = lane_max[l] > mx ? lane_max[l] : mx;
  ExpShiftedImpl(row, valid, -mx);
  Lanes lane_sum = Lanes{};
  j = 0;
  for (; j + kLanes <= valid; j += kLanes) {
    Lanes v;
    __builtin_memcpy(&v, row + j, sizeof(v));
    lane_sum += v;
  }
  float sum = 0.0f;
  for (; j < valid; ++j) sum += row[j];
  for (int l = 0; l < kLanes; ++l) sum += lane_sum[l];
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < valid; ++i) row[i] *= inv;
  for (int64_t i = valid; i < len; ++i) row[i] = 0.0f;
}

double SquaredErrorSumImpl(const float* a, const float* b, int64_t n) {
  typedef double Lanes __attribute__((vector_size(64)));
  typedef float Floats __attribute__((vector_size(32)));
  Lanes acc = Lanes{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Floats fa, fb;
    __builtin_memcpy(&fa, a + i, sizeof(fa));
    __builtin_memcpy(&fb, b + i, sizeof(fb));
    const Lanes d = __builtin_convertvector(fa, Lanes) - __builtin_convertvector(fb, Lanes);
    acc += d * d;
  }
  double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return s;
}

// This unit's table; `name` is its ISA.
VecKernels VecKernelsOfThisUnit(const char* name) {
  VecKernels k;
  k.name = name;
  k.exp_shifted = ExpShiftedImpl;
  k.scaled_softmax_row = ScaledSoftmaxRowImpl;
  k.squared_error_sum = SquaredErrorSumImpl;
  return k;
}

}  // namespace
}  // namespace nibble
