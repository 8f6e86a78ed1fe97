// The kernels' packed int4 layout ("W4P"): what Int4Linear keeps in memory and what every W4A32
// kernel (scalar, AVX2, AVX-512) reads. Byte layout and a worked example: docs/KERNELS.md.
//
// Design goals: 0.5 B per code; the scales / zero points a block needs stored right before its
// codes (one stream of cache lines, no second stream of scales); 128 codes in one 64-byte
// "superblock" arranged so that a 16-lane dword vector loaded from it yields 16 consecutive codes
// after one shift — AVX-512 turns them into weights with one vpermps through a per-group table,
// with no widening shuffles. Non-goals: weights other than 4-bit. The opt-in int8-activation
// (W4A8) and bf16-activation paths below read the same layout.
//
// A row (row_bytes apart) is a sequence of records; a record covers R = lcm(g, 128) weights of K
// when g % 16 == 0 (so each 16-code run lies in one group), else R = g (scalar kernels only); the
// last record of a row may be partial and is then padded with zeros to full size. A record holds:
//   +0          R/g fp32 scales (little endian), the stored scale values exactly
//   +4·R/g      R/g uint8 zero points 0..15                      (asymmetric only)
//   then ceil(R/128) superblocks of 64 bytes: weight o = 128·b + 16·j + l of the record (l = 0..15,
//   j = 0..7) is nibble j (bits 4j..4j+3) of little-endian dword l of superblock b.
// Symmetric weights store no zero points: they are 8 (formats/int4_matrix.h convention).
// w[n][k] = (q − zero_point) · scale, the same formula and rounding as GemmW4A32Ref.
// Any change to this layout or to a packer's bytes bumps kWeightCacheVersion
// (model/weight_cache.h), so that cached packed weights of the old layout are never mapped.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nibble {

/// Geometry of a packed weight; `data` points at N * row_bytes bytes (not owned).
struct W4PackedWeight {
  int64_t n = 0;              // out_features (rows)
  int64_t k = 0;              // in_features
  int64_t group_size = 0;     // g along K, k % g == 0
  bool symmetric = false;     // true: no zero-point bytes, zero point 8
  int64_t rec_weights = 0;    // R = lcm(g, 128) (g % 16 == 0) or g: weights of K per record
  int64_t rec_groups = 0;     // R / g scales (and zero points) per record
  int64_t rec_header = 0;     // 4·R/g (+ R/g when asymmetric): bytes before the superblocks
  int64_t rec_bytes = 0;      // rec_header + 64·ceil(R/128)
  int64_t recs = 0;           // records per row, ceil(K / R)
  int64_t row_bytes = 0;      // recs · rec_bytes
  const uint8_t* data = nullptr;
};

/// The geometry (data = nullptr) for a shape. Preconditions (abort): n, k, g >= 1, k % g == 0.
W4PackedWeight W4PackedGeometry(int64_t n, int64_t k, int64_t group_size, bool symmetric);

/// Total bytes N · row_bytes. Preconditions as W4PackedGeometry.
int64_t W4PackedBytes(int64_t n, int64_t k, int64_t group_size, bool symmetric);

/// Packs the native unpacked layout (formats/int4_matrix.h, as raw pointers) into `out`, which must
/// hold W4PackedBytes(...) bytes. codes: [N, K] 0..15, one per byte; scales: [N, K/g] fp32;
/// zero_points: [N, K/g] 0..15 (ignored when symmetric). Returns the view of `out`.
/// Preconditions (abort): shapes as in W4PackedBytes, codes/zero points <= 15.
W4PackedWeight PackW4(int64_t n, int64_t k, int64_t group_size, bool symmetric, const uint8_t* codes,
                      const float* scales, const uint8_t* zero_points, uint8_t* out);

/// Inverse of PackW4: writes codes [N, K], scales [N, K/g], zero_points [N, K/g] (8 when symmetric).
void UnpackW4(const W4PackedWeight& w, uint8_t* codes, float* scales, uint8_t* zero_points);

/// Arguments of one W4A32 GEMM on the packed layout: y = x · dequant(W)ᵀ (+ bias).
struct W4PackedGemmArgs {
  int64_t m = 0;                  // rows of x and y (tokens)
  const W4PackedWeight* w = nullptr;
  const float* x = nullptr;       // [M, K] fp32 row-major
  const float* bias = nullptr;    // [N] fp32 or nullptr
  float* y = nullptr;             // [M, N] fp32 row-major, overwritten; not aliasing x
};

/// One ISA's kernel: computes y[0..M)[n0..n1) (row range of W). Single-threaded, no allocation.
/// Every output element is a function of its own row of x and row of W only (its accumulation
/// order does not depend on n0/n1 or on M), so any split of N gives bit-identical results.
using W4GemmKernel = void (*)(const W4PackedGemmArgs& args, int64_t n0, int64_t n1);

/// One ISA's dequantizer: out[(n − n0) * K + k] = (q − z) · s for rows n0..n1 (fp32, exact as
/// DequantizeRef). Single-threaded, no allocation.
using W4DequantKernel = void (*)(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out);
/// The same rows as bf16 bit patterns: F32ToBf16 of each exact fp32 value (bit-identical on every ISA).
using W4DequantBf16Kernel = void (*)(const W4PackedWeight& w, int64_t n0, int64_t n1, uint16_t* out);

/// One ISA's streaming read: the wrapping sum of `words` 64-bit words at `p` (any alignment),
/// read with the ISA's widest loads. The bandwidth roofline of `nibble bench` (reads only).
using StreamReadKernel = uint64_t (*)(const uint64_t* p, int64_t words);

/// Opt-in W4A8 path (docs/KERNELS.md "int8 activations"): one activation row quantized
/// dynamically to int8 per block of 128 values of K (symmetric, scale = max|x| / 127, codes
/// round-half-even(x · 127 / max|x|) in −127..127, the llama.cpp Q8 scheme with 128-value blocks),
/// arranged to match the W4P superblock: per block t, 128 bytes — "A" (byte i of dword lane l =
/// x8[128t + 32i + l]) then "B" (x8[128t + 32i + 16 + l]). The low nibbles of the superblock's
/// bytes pair with A, the high nibbles with B, so one VNNI dot product per half gives the block's
/// integer sums per lane. With g < 128 a block holds `parts` = 128 / g groups: byte i of every
/// lane belongs to part i · parts / 4.
struct W4Int8Acts {
  int64_t k = 0;               // K (values beyond K within the last block are 0)
  int64_t blocks = 0;          // ceil(K / 128)
  int64_t parts = 1;           // 128 / g for g in {32, 64}; 1 when g % 128 == 0
  const int8_t* x8 = nullptr;  // [blocks][2][64]
  const float* xs = nullptr;   // [blocks] block scale max|x| / 127 (0 for an all-zero block)
  const int32_t* sx = nullptr; // [blocks][parts] sum of the part's int8 values
};

/// Whether the W4A8 kernels serve group size g: g in {32, 64} or g a multiple of 128 (every
/// superblock holds whole groups, or lies in one).
bool W4Int8ServesGroupSize(int64_t group_size);
/// W4Int8ServesGroupSize(w.group_size).
bool W4Int8Supported(const W4PackedWeight& w);
/// Parts per block for group size g (W4Int8Supported weights): 128 / g below 128, else 1.
int64_t W4Int8Parts(int64_t group_size);
/// Scratch bytes QuantizeActsInt8 needs for K and `parts`.
size_t W4Int8ActsBytes(int64_t k, int64_t parts);
/// Quantizes x[K] (fp32) into `scratch` (W4Int8ActsBytes bytes, any alignment) and returns the
/// view. Deterministic scalar code shared by every ISA. Non-finite x is the caller's problem (the
/// model never produces it): the block's codes are then unspecified but the call is safe.
W4Int8Acts QuantizeActsInt8(const float* x, int64_t k, int64_t parts, uint8_t* scratch);

/// One ISA's W4A8 GEMM: y[i][n] for the M quantized activation rows a[0..M) and weight rows
/// n0..n1 (y row-major [M, N], row stride w.n). Arithmetic per (i, n), fixed so every ISA and
/// every tiling is bit-identical: for each block t and part p in order (parts whose group starts
/// at or beyond K skipped), with the part's group scale s and zero point z, fs = s · xs[t] (fp32)
/// and, for each of the 16 dword lanes l of the superblock, v_l = Σ over the part's bytes i of
/// lo(byte 4l+i)·A[4l+i] + hi(byte 4l+i)·B[4l+i] (exact int), lane 0 starting at −z · sx[t][p]
/// (the zero-point term, subtracted exactly in int32: |v_l| < 2^18, so float(v_l) is exact);
/// acc[l] = fma(fs, float(v_l), acc[l]). Then the lanes are summed as a tree (l + 8, l + 4,
/// l + 2, l + 1) and y = acc (+ bias[n]). Single-threaded, no allocation.
/// Precondition: W4Int8Supported(w); every a[i].parts == W4Int8Parts(w.group_size), a[i].k == w.k.
using W4GemmI8Kernel = void (*)(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y,
                                int64_t n0, int64_t n1);
/// Scalar W4A8 GEMM (the oracle and the fallback on CPUs without AVX2).
void GemmW4A8PackedScalar(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y,
                          int64_t n0, int64_t n1);

/// Opt-in bf16-activation path (docs/KERNELS.md "bf16 activations"): W4A16 with the activations
/// rounded to bf16 (round to nearest even), the numerics of a W4A16 engine running bf16. One
/// activation row, arranged to match the W4P superblock for `vdpbf16ps`: per run u of 32 values of
/// K (values 32u .. 32u + 31, zeros beyond K), 32 bf16 words where word 2l = bf16(x[32u + l]) and
/// word 2l + 1 = bf16(x[32u + 16 + l]), l = 0..15 — the two weights that dword lane l of the
/// superblock holds in nibbles 2c and 2c + 1 (c = u mod 4). Per group gi, with σ = Σ_k bf16(x_k)
/// over the group (fp32, k ascending): c0[gi] = −8·σ and c1[gi] = −σ/16, so that
/// c0 + z·c1 = −(128 + z)·σ/16 is the per-lane share of the zero-point correction (the kernel
/// multiplies the codes as the bf16 values 128 + q, whose bits are 0x4300 | q); zc holds that
/// share for every zero point, fma(z, c1, c0) rounded once, so a row loop starts a group's chain
/// with one broadcast load instead of an FMA of three broadcasts.
struct W4Bf16Acts {
  int64_t k = 0;                // K
  int64_t group_size = 0;       // g (a multiple of 32)
  int64_t runs = 0;             // ceil(K / 32)
  const uint16_t* xb = nullptr; // [runs][32] bf16 bit patterns, 64-byte aligned when the scratch is
  const float* c0 = nullptr;    // [K / g]
  const float* c1 = nullptr;    // [K / g]
  const float* zc = nullptr;    // [K / g][16]: zc[16·gi + z] = fma(z, c1[gi], c0[gi]), z = 0..15
  /// [runs][32] the same values as fp32 in K order (xf[32u + l] is word 2l of run u, xf[32u + 16
  /// + l] word 2l + 1), subnormals as zero: the operands of the FMA blocks, which reproduce
  /// vdpbf16ps (kernels/x86_avx512bf16/int4_gemm_bf16.h).
  const float* xf = nullptr;
  /// g = 128 only (else nullptr): [K / 128][128] the same bf16 words paired for the decode loop
  /// that unpacks by shifts (kernels/x86_avx512bf16/run_words.h ShiftWords): in superblock s,
  /// word 32c + 2l <- 128s + 16c + l and word 32c + 2l + 1 <- 128s + 64 + 16c + l (c = 0..3).
  const uint16_t* xs = nullptr;
};

/// How the AVX-512 BF16 one-row decode loop at g = 128 unpacks a superblock's runs: one
/// `vpmultishiftqb` each (activations W4Bf16Acts::xb), or by 32-bit shifts (W4Bf16Acts::xs,
/// another pairing of the same weights, so other bits) for cores where shifts issue beside
/// `vdpbf16ps` and `vpmultishiftqb` does not (Zen 4; docs/KERNELS.md "What limits the decode
/// loops on Zen 4").
enum class W4Bf16Unpack { kMultishift, kShift };
inline const char* W4Bf16UnpackName(W4Bf16Unpack u) { return u == W4Bf16Unpack::kShift ? "shift" : "multishift"; }

/// The running CPU's L1 data cache per core in bytes (sysconf; 32 KiB where the system does not say).
int64_t L1DataCacheBytes();
/// Activation bytes a decode loop at g = 128 reads per group of 128 weights: bf16 (W4Bf16Acts)
/// 128 words + 16 fp32 chain starts (zc); int8 (W4Int8Acts) 128 bytes + the scale xs + Σx8 sx.
constexpr int64_t kW4Bf16ActBytesPerGroup = 128 * 2 + 16 * 4;
constexpr int64_t kW4I8ActBytesPerGroup = 128 + 4 + 4;
/// The long-row decode loops' pass: weight rows at a time and groups (superblocks) per chunk.
constexpr int kW4DecodeChunkRows = 8;
constexpr int64_t kW4DecodeChunkGroups = 8;
/// K from which the AVX-512 decode loops at g = 128 (bf16, int8) read kW4DecodeChunkRows weight
/// rows at a time in chunks of kW4DecodeChunkGroups groups: where a row's activations (`act_bytes_per_group` per 128 weights)
/// pass 3/4 of an L1 data cache of `l1d_bytes`, in whole groups. The same bits either way
/// (docs/KERNELS.md "Long rows").
int64_t W4DecodeChunkMinK(int64_t l1d_bytes, int64_t act_bytes_per_group);

/// Whether the bf16-activation kernel serves group size g: g a multiple of 32 (each 32-weight run
/// of a superblock lies in one group).
bool W4Bf16ServesGroupSize(int64_t group_size);
/// W4Bf16ServesGroupSize(w.group_size).
bool W4Bf16Supported(const W4PackedWeight& w);
/// Scratch bytes PrepareActsBf16 needs for K and g (every array 64-byte aligned within it).
size_t W4Bf16ActsBytes(int64_t k, int64_t group_size);
/// Rounds x[K] (fp32) to bf16 and arranges it into `scratch` (W4Bf16ActsBytes bytes; 64-byte
/// aligned for aligned vector loads) as W4Bf16Acts describes. Deterministic: the per-value work is
/// the active ISA's VecKernels::bf16_acts, the same bits on every ISA. Preconditions (abort):
/// k >= 1, group_size >= 32, group_size % 32 == 0, k % g == 0.
W4Bf16Acts PrepareActsBf16(const float* x, int64_t k, int64_t group_size, uint8_t* scratch);
/// Rounds x[n] to bf16 and back to fp32 (round to nearest even) into out[n]; the activations the
/// bf16 path computes with (the fallback runs the W4A32 kernel on them).
void RoundToBf16(const float* x, int64_t n, float* out);
/// bf16(x[i]) (round to nearest even) as bit patterns into out[n].
void ToBf16Bits(const float* x, int64_t n, uint16_t* out);

/// One ISA's bf16-activation GEMM: y[i][n] = Σ_k bf16(x_i[k]) · (q − z)·s (+ bias[n]) for the M
/// prepared rows a[0..M) and weight rows n0..n1 (y row-major [M, N], row stride w.n). Per (i, n)
/// the arithmetic is fixed by K, g, whether M reaches the kernel's block threshold and, at M = 1
/// and g = 128, the CPU's W4Bf16Unpack (docs/KERNELS.md) — independent of n0, n1 and of the row's place in the batch — so any N split
/// and any thread count give bit-identical results. Single-threaded, no allocation.
/// Precondition: W4Bf16Supported(w); every a[i].k == w.k and a[i].group_size == w.group_size.
using W4GemmBf16Kernel = void (*)(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias,
                                  float* y, int64_t n0, int64_t n1);

/// Up to kW4Bf16BatchMaxRows prepared rows rearranged once per call for a tile kernel (AMX:
/// x86_amx/int4_gemm_amx.h), which takes the weights as the left operand and the activations as
/// the right one. Per 32-weight run u a 16 × 16 block of dwords, row l (the run's weight pair l,
/// word order as W4Bf16Acts.xb) × column i (activation row i; zero from M on):
/// pairs[256·u + 16·l + i] = dword l of run u of a[i].xb. Per group gi 16 lanes of 16·c0 and
/// 16·c1 of each row (zero from M on): c0[16·gi + i], c1[16·gi + i] (powers of two: exact).
struct W4Bf16Batch {
  int64_t m = 0, k = 0, group_size = 0, runs = 0;
  const uint32_t* pairs = nullptr;  // [runs][16][16], 64-byte aligned
  const float* c0 = nullptr;        // [K / g][16]
  const float* c1 = nullptr;        // [K / g][16]
};
inline constexpr int64_t kW4Bf16BatchMaxRows = 16;
/// From this many rows on GemmW4Bf16Packed runs the AMX tile kernel where the kernels have one
/// (below it the AVX-512 BF16 blocks are faster: docs/PERFORMANCE.md "Batched decode").
inline constexpr int64_t kW4Bf16AmxMinRows = 4;
/// Scratch bytes PrepareBf16Batch needs for K and g.
size_t W4Bf16BatchBytes(int64_t k, int64_t group_size);
/// Arranges a[0..m) (PrepareActsBf16 rows of one K and g) into `scratch` (W4Bf16BatchBytes,
/// 64-byte aligned). Preconditions (abort): 1 <= m <= kW4Bf16BatchMaxRows, rows of one K and g.
W4Bf16Batch PrepareBf16Batch(const W4Bf16Acts* a, int64_t m, uint8_t* scratch);
/// A tile kernel over a batch: y[i][n] for i < batch.m and weight rows n0..n1 (< 16 apart), as
/// W4GemmBf16Kernel; per (i, n) the arithmetic is fixed by K and g (any N split, any M up to the
/// maximum, any thread count: bit-identical). Precondition: g a multiple of 128, batch of w's K, g.
using W4GemmBf16BatchKernel = void (*)(const W4PackedWeight& w, const W4Bf16Batch& batch, const float* bias,
                                       float* y, int64_t n0, int64_t n1);

/// Scalar kernels on the packed layout (the fallback; same arithmetic and order as GemmW4A32Ref,
/// so their results are bit-identical to it).
void GemmW4A32PackedScalar(const W4PackedGemmArgs& args, int64_t n0, int64_t n1);
void DequantW4PackedScalar(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out);
void DequantW4PackedBf16Scalar(const W4PackedWeight& w, int64_t n0, int64_t n1, uint16_t* out);
uint64_t StreamReadScalar(const uint64_t* p, int64_t words);

namespace w4p {
/// Scalar-side helpers shared by the ISA translation units (inline, no ISA flags needed).
inline float Scale(const uint8_t* rec, int64_t gi) {
  float s;
  __builtin_memcpy(&s, rec + 4 * gi, 4);
  return s;
}
inline int Zero(const W4PackedWeight& w, const uint8_t* rec, int64_t gi) {
  return w.symmetric ? 8 : rec[4 * w.rec_groups + gi];
}
/// Code of weight o (0 <= o < R) of a record.
inline int CodeAt(const W4PackedWeight& w, const uint8_t* rec, int64_t o) {
  const int64_t b = o / 128, j = (o % 128) / 16, l = o % 16;
  const uint8_t byte = rec[w.rec_header + 64 * b + 4 * l + j / 2];
  return (j & 1) ? (byte >> 4) : (byte & 15);
}
/// Whether SIMD kernels can run 16-weight runs: every run lies inside one group.
inline bool RunsFitGroups(const W4PackedWeight& w) { return w.group_size % 16 == 0; }
}  // namespace w4p

}  // namespace nibble
