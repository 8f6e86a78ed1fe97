// Runtime ISA dispatch for the W4A32 kernels and the vectorised row ops (kernels/vec_ops.h): one
// table chosen once per process from CPUID and XCR0 (the OS must save YMM / ZMM state, checked
// with xgetbv), overridable with the environment variable NIBBLE_ISA=scalar|avx2|avx512.
// `nibble inspect --kernels` prints the decision.
//
// Policy: the best ISA that is compiled in and supported wins. NIBBLE_ISA naming an ISA that is
// compiled and supported forces it; an unknown value, or an ISA this build or CPU cannot run,
// falls back to the automatic choice and says why in `message` (printed once to stderr).
#pragma once

#include <string>
#include <vector>

#include "kernels/bf16_gemv.h"
#include "kernels/int4_packed.h"
#include "kernels/stream_prefetch.h"
#include "kernels/vec_ops.h"

namespace nibble {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/// Lower-case ISA name as accepted by NIBBLE_ISA: "scalar", "avx2", "avx512".
const char* IsaName(Isa isa);

/// CPU facts the dispatch needs (all false on non-x86 builds).
struct CpuFeatures {
  std::string vendor;  // CPUID leaf 0 vendor string, e.g. "AuthenticAMD"
  int family = 0;      // CPUID.1:EAX display family (base + extended when base is 0xF): Zen 4 0x19
  bool osxsave = false;                                      // CPUID.1:ECX.OSXSAVE
  bool avx = false, fma = false, f16c = false, avx2 = false;  // CPUID leaves 1 and 7
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false;  // CPUID.7.0:ECX bit 11 (the opt-in W4A8 kernel)
  bool avx512vbmi = false;  // CPUID.7.0:ECX bit 1 (vpmultishiftqb, the opt-in bf16-activation kernel)
  bool avx512bf16 = false;  // CPUID.7.1:EAX bit 5 (vdpbf16ps, the opt-in bf16-activation kernel)
  bool os_ymm = false;  // XCR0 bits 1,2 (SSE, AVX state) enabled by the OS
  bool os_zmm = false;  // XCR0 bits 5,6,7 (opmask, ZMM_Hi256, Hi16_ZMM) enabled by the OS
  bool amx_tile = false, amx_bf16 = false;  // CPUID.7.0:EDX bits 24, 22 (the batched-decode tile kernel)
  /// XCR0 bits 17, 18 (tile config, tile data) enabled and the tile data granted to this process
  /// (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked by DetectCpuFeatures when the CPU has AMX).
  bool os_amx = false;
};

/// Reads CPUID / XCR0 of the running CPU.
CpuFeatures DetectCpuFeatures();

/// One ISA's kernels.
struct W4Kernels {
  Isa isa = Isa::kScalar;
  W4GemmKernel gemm = nullptr;
  W4DequantKernel dequant = nullptr;
  W4DequantBf16Kernel dequant_bf16 = nullptr;
  StreamReadKernel stream_read = nullptr;
  /// Opt-in W4A8 GEMV (int8 activations): AVX-512 VNNI when the ISA is avx512 and the CPU has
  /// avx512_vnni, else AVX2 (vpmaddubsw) when the ISA is avx2 or avx512, else the scalar kernel
  /// (same results, bit for bit).
  W4GemmI8Kernel gemm_i8 = nullptr;
  const char* gemm_i8_name = "scalar";  // "avx512_vnni" | "avx2" | "scalar"
  /// Opt-in bf16-activation GEMM (W4Bf16Acts): AVX-512 BF16 when the ISA is avx512 and the CPU
  /// has avx512_bf16 and avx512_vbmi, else nullptr (Int4Linear then rounds the activations to
  /// bf16 and runs `gemm`: the same inputs, a different fp32 summation order).
  W4GemmBf16Kernel gemm_bf16 = nullptr;
  const char* gemm_bf16_name = "w4a32_rounded";  // "avx512_bf16" | "w4a32_rounded" (none: W4A32 on rounded inputs)
  /// AMX tile kernel for 2..kW4Bf16BatchMaxRows bf16 activation rows (GemmW4Bf16Packed uses it
  /// there when g is a multiple of 128): with gemm_bf16 where the CPU has amx_tile and amx_bf16
  /// and the OS grants the tile state, else nullptr.
  W4GemmBf16BatchKernel gemm_bf16_amx = nullptr;
  /// The bf16 dot-product peak loop (x86_avx512bf16/bf16_peak.h) where gemm_bf16 is AVX-512 BF16.
  float (*bf16_dot_peak)(int64_t iters, float seed) = nullptr;
  /// bf16-weight GEMV of dense linears kept as bf16 (avx512, avx2; GemvBf16Scalar is the test
  /// oracle). nullptr for scalar: bf16 linears are then widened to fp32 at load and run through
  /// the dense sgemm (model/linear.h).
  Bf16GemvKernel gemv_bf16 = nullptr;
  /// The row ops of kernels/vec_ops.h built for the same ISA (bit-identical on every ISA).
  VecKernels vec;
  /// The hint of the decode loops' software prefetch (the AVX-512 row GEMV, the int8 / bf16
  /// decode loops and the AVX2 one at g = 128); the same numbers either way.
  StreamPrefetch row_prefetch = StreamPrefetch::kNonTemporal;
  /// How gemm_bf16's one-row decode loop at g = 128 unpacks the codes (AVX-512 BF16 only).
  W4Bf16Unpack bf16_unpack = W4Bf16Unpack::kMultishift;
  /// bf16-activation prefill (Int4Linear from Bf16MatmulMinRows rows) through the fp32 sgemm on
  /// the bf16-rounded rows and the exact weights instead of oneDNN's bf16 matmul, and the bf16
  /// calibration GEMMs on widened values (GemmBf16XWt declines): set on GenuineIntel CPUs
  /// without AMX, whose `vdpbf16ps` runs at half the rate of their two FMA ports
  /// (docs/PERFORMANCE.md "Prefill on Intel without AMX").
  bool bf16_prefill_sgemm = false;
};

/// How one candidate ISA fared.
struct IsaCandidate {
  Isa isa = Isa::kScalar;
  bool compiled = false;   // this build contains its translation unit
  bool supported = false;  // the CPU and OS can run it
  bool chosen = false;
  std::string reason;      // e.g. "CPU lacks avx512bw", "OS does not save ZMM state (XCR0=0x7)"
};

/// The decision: the chosen kernels, every candidate with its reason, and the override handling.
struct W4Dispatch {
  W4Kernels kernels;
  std::vector<IsaCandidate> candidates;  // best first: avx512, avx2, scalar
  std::string override_value;            // NIBBLE_ISA as given ("" when unset)
  std::string message;                   // non-empty when the override was rejected (why)
  std::string gemm_i8_reason;            // why kernels.gemm_i8 is the one it is
  std::string gemm_bf16_reason;          // why kernels.gemm_bf16 is the one it is
  std::string prefetch_reason;           // why kernels.row_prefetch is the one it is
  std::string prefetch_message;          // non-empty when NIBBLE_PREFETCH was rejected (why)
  std::string bf16_unpack_message;       // non-empty when NIBBLE_BF16_UNPACK was rejected (why)
  /// The unpack chosen for the AVX-512 BF16 decode loop, also when the chosen ISA has none
  /// (W4KernelsFor builds the other ISAs' tables with it).
  W4Bf16Unpack bf16_unpack = W4Bf16Unpack::kMultishift;
};

/// Pure decision from `cpu`, the NIBBLE_ISA value and the NIBBLE_PREFETCH value (nta | t0; nullptr
/// or "" = unset: t0 on GenuineIntel, nta elsewhere); testable with a fake CPU.
/// `unpack_override` (NIBBLE_BF16_UNPACK: multishift | shift; unset: shift on Zen 4) picks
/// W4Kernels::bf16_unpack.
W4Dispatch ResolveW4Dispatch(const CpuFeatures& cpu, const char* isa_override, const char* prefetch_override = nullptr,
                             const char* unpack_override = nullptr);

/// The process-wide decision, made on first use from DetectCpuFeatures(), getenv("NIBBLE_ISA"),
/// getenv("NIBBLE_PREFETCH") and getenv("NIBBLE_BF16_UNPACK"); a rejected override is reported once
/// on stderr ("nibble: NIBBLE_ISA=...: ...").
const W4Dispatch& ActiveW4Dispatch();

/// Kernels of `isa` when compiled in and supported by this CPU, else nullptr (tests, bench).
const W4Kernels* W4KernelsFor(Isa isa);

}  // namespace nibble
