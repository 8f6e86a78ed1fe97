// CPUID / XCR0 detection and the W4A32 dispatch decision (see int4_dispatch.h).
#include "kernels/int4_dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>

#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/x86_amx/int4_gemm_amx.h"
#include "kernels/x86_avx2/int4_gemm_avx2.h"
#include "kernels/x86_avx2/int4_gemm_i8_avx2.h"
#include "kernels/x86_avx2/vec_ops_avx2.h"
#include "kernels/x86_avx512/int4_gemm_avx512.h"
#include "kernels/x86_avx512/vec_ops_avx512.h"
#include "kernels/x86_avx512bf16/bf16_peak.h"
#include "kernels/x86_avx512bf16/int4_gemm_bf16.h"
#include "kernels/x86_avx512vnni/int4_gemm_i8_vnni.h"
#endif

namespace nibble {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

#if defined(__x86_64__)
// Linux hands out the AMX tile data state per process on request (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); without the grant the first tile instruction faults. Asked once.
bool RequestTileData() {
  static const bool granted = [] {
#if defined(__linux__)
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return granted;
}
#endif

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  vendor[12] = 0;
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = static_cast<int>((a >> 8) & 0xF);
  f.family = base_family == 0xF ? base_family + static_cast<int>((a >> 20) & 0xFF) : base_family;
  f.fma = (c >> 12) & 1;
  f.osxsave = (c >> 27) & 1;
  f.avx = (c >> 28) & 1;
  f.f16c = (c >> 29) & 1;
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
    f.avx512vbmi = (c >> 1) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    if (a >= 1) {  // CPUID.7.0:EAX = the highest sub-leaf of leaf 7
      unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
      __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
      f.avx512bf16 = (a1 >> 5) & 1;
    }
  }
  if (f.osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_ymm = (lo & 0x6) == 0x6;
    f.os_zmm = f.os_ymm && (lo & 0xE0) == 0xE0;
    f.os_amx = f.amx_tile && (lo & 0x60000) == 0x60000 && RequestTileData();
  }
#endif
  return f;
}

namespace {

#if defined(__x86_64__)
constexpr bool kX86 = true;
#else
constexpr bool kX86 = false;
#endif

// Intel cores: prefetchnta lines stall the decode loops, and vdpbf16ps issues at half the FMA rate.
bool IntelCore(const CpuFeatures& cpu) { return cpu.vendor == "GenuineIntel"; }

// Zen 4 (family 0x19 with AVX-512): vpmultishiftqb shares the issue slots of vdpbf16ps, shifts
// mostly not, so the one-row decode loop unpacks by shifts (W4Bf16Unpack::kShift).
bool Zen4Core(const CpuFeatures& cpu) { return cpu.vendor == "AuthenticAMD" && cpu.family == 0x19; }

// The kernels of `isa` on `cpu`; `i8_reason` / `bf16_reason` (optional) get why gemm_i8 /
// gemm_bf16 are the ones they are.
W4Kernels KernelsOf(Isa isa, const CpuFeatures& cpu, StreamPrefetch prefetch, W4Bf16Unpack unpack,
                    bool unpack_forced, const std::string& unpack_why, std::string* i8_reason = nullptr,
                    std::string* bf16_reason = nullptr) {
  std::string reason = "no vector W4A8 kernel for ISA " + std::string(IsaName(isa));
  const char* const kRounded = ": the W4A32 kernels run on bf16-rounded inputs";
  std::string breason = "no AVX-512 BF16 kernel for ISA " + std::string(IsaName(isa)) + kRounded;
  W4Kernels k;
  k.isa = isa;
  k.gemm = GemmW4A32PackedScalar;
  k.dequant = DequantW4PackedScalar;
  k.dequant_bf16 = DequantW4PackedBf16Scalar;
  k.stream_read = StreamReadScalar;
  k.gemm_i8 = GemmW4A8PackedScalar;
  k.gemm_i8_name = "scalar";
  k.gemv_bf16 = nullptr;  // scalar: bf16 linears are widened to fp32 at load (sgemm)
  k.vec = VecKernelsScalar();
  k.row_prefetch = prefetch;
  constexpr StreamPrefetch kNta = StreamPrefetch::kNonTemporal, kT0 = StreamPrefetch::kL1;
  const bool t0 = prefetch == kT0;
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) {
    k.gemm = t0 ? GemmW4A32Avx2<kT0> : GemmW4A32Avx2<kNta>;
    k.dequant = DequantW4Avx2;
    k.stream_read = StreamReadAvx2;
    k.gemv_bf16 = GemvBf16Avx2;
    k.vec = VecKernelsAvx2();
    k.gemm_i8 = t0 ? GemmW4A8Avx2<kT0> : GemmW4A8Avx2<kNta>;
    k.gemm_i8_name = "avx2";
    reason = "ISA avx2: vpmaddubsw";
  } else if (isa == Isa::kAvx512) {
    k.gemm = t0 ? GemmW4A32Avx512<kT0> : GemmW4A32Avx512<kNta>;
    k.dequant = DequantW4Avx512;
    k.dequant_bf16 = DequantW4Bf16Avx512;
    k.stream_read = StreamReadAvx512;
    k.gemv_bf16 = GemvBf16Avx512;
    k.vec = VecKernelsAvx512();
    if (cpu.avx512bf16 && cpu.avx512vbmi) {
      k.gemm_bf16 = t0 ? GemmW4Bf16Avx512<kT0> : GemmW4Bf16Avx512<kNta>;
      k.gemm_bf16_name = "avx512_bf16";
      k.bf16_dot_peak = Bf16DotPeakAvx512;
      breason = "avx512 with avx512_bf16 and avx512_vbmi";
      if (cpu.amx_tile && cpu.amx_bf16 && cpu.os_amx) {
        k.gemm_bf16_amx = GemmW4Bf16Amx;
        breason += "; AMX tiles from " + std::to_string(kW4Bf16AmxMinRows) + " rows where g is a multiple of 128";
      } else if (IntelCore(cpu)) {
        constexpr W4Bf16BlockArith kFma = W4Bf16BlockArith::kFma;
        k.gemm_bf16 = t0 ? GemmW4Bf16Avx512<kT0, kFma> : GemmW4Bf16Avx512<kNta, kFma>;
        k.bf16_prefill_sgemm = true;
        breason += "; batched blocks in fp32 FMAs and prefill on the fp32 sgemm (Intel without AMX: vdpbf16ps at "
                   "half the FMA rate)";
      }
      if (unpack == W4Bf16Unpack::kShift) {
        constexpr W4Bf16Unpack kShift = W4Bf16Unpack::kShift;
        constexpr W4Bf16BlockArith kDp = W4Bf16BlockArith::kDpbf16, kFma = W4Bf16BlockArith::kFma;
        if (k.bf16_prefill_sgemm)
          k.gemm_bf16 = t0 ? GemmW4Bf16Avx512<kT0, kFma, kShift> : GemmW4Bf16Avx512<kNta, kFma, kShift>;
        else
          k.gemm_bf16 = t0 ? GemmW4Bf16Avx512<kT0, kDp, kShift> : GemmW4Bf16Avx512<kNta, kDp, kShift>;
        k.bf16_unpack = unpack;
        breason += "; decode loop unpacking by shifts (" + unpack_why + ")";
      } else if (unpack_forced) {
        breason += "; decode loop unpacking by vpmultishiftqb (" + unpack_why + ")";
      }
    } else {
      breason = std::string("CPU lacks ") + (cpu.avx512bf16 ? "avx512_vbmi" : "avx512_bf16") + kRounded;
    }
    if (cpu.avx512vnni) {
      k.gemm_i8 = t0 ? GemmW4A8Vnni<kT0> : GemmW4A8Vnni<kNta>;
      k.gemm_i8_name = "avx512_vnni";
      reason = "avx512 with avx512_vnni";
    } else {
      k.gemm_i8 = t0 ? GemmW4A8Avx2<kT0> : GemmW4A8Avx2<kNta>;
      k.gemm_i8_name = "avx2";
      reason = "CPU lacks avx512_vnni: vpmaddubsw on avx2";
    }
  }
#else
  (void)cpu;
  (void)t0;
#endif
  if (i8_reason != nullptr) *i8_reason = reason;
  if (bf16_reason != nullptr) *bf16_reason = breason;
  return k;
}

// Missing requirements of `isa` on `cpu`, "" when supported.
std::string Missing(Isa isa, const CpuFeatures& cpu) {
  std::string m;
  auto need = [&](bool ok, const char* what) {
    if (!ok) m += (m.empty() ? "" : ", ") + std::string(what);
  };
  if (isa == Isa::kAvx2) {
    need(cpu.avx, "avx");
    need(cpu.avx2, "avx2");
    need(cpu.fma, "fma");
    need(cpu.f16c, "f16c");
    if (!m.empty()) return "CPU lacks " + m;
    if (!cpu.osxsave || !cpu.os_ymm) return "OS does not save YMM state (XCR0 bits 1-2 / OSXSAVE)";
  } else if (isa == Isa::kAvx512) {
    need(cpu.avx512f, "avx512f");
    need(cpu.avx512bw, "avx512bw");
    need(cpu.avx512vl, "avx512vl");
    need(cpu.avx512dq, "avx512dq");
    need(cpu.fma, "fma");
    if (!m.empty()) return "CPU lacks " + m;
    if (!cpu.osxsave || !cpu.os_zmm) return "OS does not save ZMM state (XCR0 bits 5-7 / OSXSAVE)";
  }
  return "";
}

// An environment override among named values: `out` = the option named `forced` (the value of
// `var`; nullptr or "" = unset) and `reason` = "forced by VAR=value", true; an unknown value
// sets `message` ("unknown WHAT ... (expected a or b)") and returns false, as does unset.
template <typename T, size_t N>
bool ForcedChoice(const char* var, const char* what, const char* forced, const T (&options)[N],
                  const char* (*name_of)(T), T& out, std::string& reason, std::string& message) {
  const std::string o = forced != nullptr ? forced : "";
  std::string expected;
  for (size_t i = 0; i < N; ++i) {
    if (o == name_of(options[i])) {
      out = options[i];
      reason = "forced by " + std::string(var) + "=" + o;
      return true;
    }
    expected += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + name_of(options[i]);
  }
  if (!o.empty())
    message = "unknown " + std::string(what) + " \"" + o + "\" (expected " + expected + "); using the automatic choice";
  return false;
}

// The decode loops' prefetch hint: t0 on Intel, whose cores stall on prefetchnta lines (they go to
// L1 only), nta elsewhere (the fastest measured on AMD Zen 5); docs/PERFORMANCE.md "Decode
// prefetch on Intel". `forced` (NIBBLE_PREFETCH) names one; an unknown value sets `message`.
StreamPrefetch ChoosePrefetch(const CpuFeatures& cpu, const char* forced, std::string& reason, std::string& message) {
  StreamPrefetch p = StreamPrefetch::kNonTemporal;
  if (ForcedChoice("NIBBLE_PREFETCH", "prefetch hint", forced, {StreamPrefetch::kNonTemporal, StreamPrefetch::kL1},
                   StreamPrefetchName, p, reason, message))
    return p;
  if (IntelCore(cpu)) {
    reason = cpu.vendor;
    return StreamPrefetch::kL1;
  }
  reason = cpu.vendor.empty() ? "unknown vendor" : cpu.vendor;
  return StreamPrefetch::kNonTemporal;
}

// NIBBLE_PREFETCH as the process sees it (nullptr when unset).
const char* PrefetchOverride() { return std::getenv("NIBBLE_PREFETCH"); }

// The bf16 decode loop's unpack: shifts on Zen 4, vpmultishiftqb elsewhere; `forced`
// (NIBBLE_BF16_UNPACK) names one (then `was_forced`); an unknown value sets `message`. `why`:
// the reason for the choice.
W4Bf16Unpack ChooseBf16Unpack(const CpuFeatures& cpu, const char* forced, bool& was_forced, std::string& why,
                              std::string& message) {
  W4Bf16Unpack u = W4Bf16Unpack::kMultishift;
  was_forced = ForcedChoice("NIBBLE_BF16_UNPACK", "unpack", forced, {W4Bf16Unpack::kMultishift, W4Bf16Unpack::kShift},
                            W4Bf16UnpackName, u, why, message);
  if (was_forced) return u;
  why = "Zen 4: vpmultishiftqb shares vdpbf16ps's issue slots";
  return Zen4Core(cpu) ? W4Bf16Unpack::kShift : W4Bf16Unpack::kMultishift;
}

const char* UnpackOverride() { return std::getenv("NIBBLE_BF16_UNPACK"); }

}  // namespace

W4Dispatch ResolveW4Dispatch(const CpuFeatures& cpu, const char* isa_override, const char* prefetch_override,
                             const char* unpack_override) {
  W4Dispatch d;
  d.override_value = isa_override != nullptr ? isa_override : "";
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    IsaCandidate c;
    c.isa = isa;
    c.compiled = isa == Isa::kScalar || kX86;
    const std::string missing = c.compiled ? Missing(isa, cpu) : "not compiled in (non-x86-64 build)";
    c.supported = c.compiled && missing.empty();
    c.reason = missing;
    d.candidates.push_back(c);
  }
  int chosen = -1;
  if (!d.override_value.empty()) {
    for (size_t i = 0; i < d.candidates.size(); ++i)
      if (d.override_value == IsaName(d.candidates[i].isa)) chosen = static_cast<int>(i);
    if (chosen < 0) {
      d.message = "unknown ISA \"" + d.override_value + "\" (expected scalar, avx2 or avx512); using the automatic choice";
    } else if (!d.candidates[chosen].supported) {
      d.message = std::string(IsaName(d.candidates[chosen].isa)) + " cannot run here (" + d.candidates[chosen].reason +
                  "); using the automatic choice";
      chosen = -1;
    }
  }
  const bool forced = chosen >= 0;
  if (!forced)
    for (size_t i = 0; i < d.candidates.size(); ++i)
      if (d.candidates[i].supported) {
        chosen = static_cast<int>(i);
        break;
      }
  for (size_t i = 0; i < d.candidates.size(); ++i) {
    IsaCandidate& c = d.candidates[i];
    if (static_cast<int>(i) == chosen) {
      c.chosen = true;
      c.reason = forced ? "forced by NIBBLE_ISA=" + d.override_value : "best supported ISA";
    } else if (c.supported) {
      c.reason = static_cast<int>(i) > chosen ? "supported, but a wider ISA was chosen"
                                              : "supported, but NIBBLE_ISA=" + d.override_value + " forced another";
    }
  }
  const StreamPrefetch prefetch = ChoosePrefetch(cpu, prefetch_override, d.prefetch_reason, d.prefetch_message);
  std::string unpack_why;
  bool unpack_forced = false;
  d.bf16_unpack = ChooseBf16Unpack(cpu, unpack_override, unpack_forced, unpack_why, d.bf16_unpack_message);
  d.kernels = KernelsOf(d.candidates[chosen].isa, cpu, prefetch, d.bf16_unpack, unpack_forced, unpack_why,
                        &d.gemm_i8_reason, &d.gemm_bf16_reason);
  return d;
}

const W4Dispatch& ActiveW4Dispatch() {
  static const W4Dispatch d = [] {
    W4Dispatch r = ResolveW4Dispatch(DetectCpuFeatures(), std::getenv("NIBBLE_ISA"), PrefetchOverride(), UnpackOverride());
    if (!r.message.empty()) std::fprintf(stderr, "nibble: NIBBLE_ISA=%s: %s\n", r.override_value.c_str(), r.message.c_str());
    if (!r.prefetch_message.empty())
      std::fprintf(stderr, "nibble: NIBBLE_PREFETCH=%s: %s\n", PrefetchOverride(), r.prefetch_message.c_str());
    if (!r.bf16_unpack_message.empty())
      std::fprintf(stderr, "nibble: NIBBLE_BF16_UNPACK=%s: %s\n", UnpackOverride(), r.bf16_unpack_message.c_str());
    return r;
  }();
  return d;
}

const W4Kernels* W4KernelsFor(Isa isa) {
  static const CpuFeatures cpu = DetectCpuFeatures();
  const StreamPrefetch p = ActiveW4Dispatch().kernels.row_prefetch;
  const W4Bf16Unpack u = ActiveW4Dispatch().bf16_unpack;
  const std::string why = "as the active dispatch";
  static const W4Kernels table[3] = {KernelsOf(Isa::kScalar, cpu, p, u, false, why),
                                     KernelsOf(Isa::kAvx2, cpu, p, u, false, why),
                                     KernelsOf(Isa::kAvx512, cpu, p, u, false, why)};
  for (const IsaCandidate& c : ActiveW4Dispatch().candidates)
    if (c.isa == isa && c.supported) return &table[static_cast<int>(isa)];
  return nullptr;
}

}  // namespace nibble
