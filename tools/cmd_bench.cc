// `nibble bench`: (a) DRAM read bandwidth, (b) int4 GEMV/GEMM on LLM shapes with weights cycling
// past L3, reported as weight GB/s, % of the measured bandwidth and GFLOP/s (best round; the mean
// is printed too). End-to-end tokens/s:
// `nibble synth` + `nibble generate` (README "Kernels and benchmarks").
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"
#include "support/flags.h"

namespace nibble_cli {

namespace {
struct BenchArgs {
  int threads = 0;
  double bandwidth_gib = 1.0;
  int passes = 5;
  std::vector<std::string> shapes = {"4096x4096", "4096x11008", "11008x4096", "4096x14336"};
  std::vector<int64_t> groups = {128, 32};
  std::vector<int64_t> ms = {1, 16, 512};
  double cycle_gib = 1.0;
  double seconds = 1.0;
  bool skip_bandwidth = false, skip_gemm = false;
  bool int8 = false;
  bool bf16 = false;
};

// Every flag before anything is measured: shapes, group sizes the paths serve, positive sizes.
std::string CheckFlags(const BenchArgs& a) {
  if (!(a.bandwidth_gib > 0)) return "--bandwidth_gib " + std::to_string(a.bandwidth_gib) + " must be > 0";
  if (a.passes < 1) return "--passes " + std::to_string(a.passes) + " must be >= 1";
  if (!(a.cycle_gib > 0)) return "--cycle_gib " + std::to_string(a.cycle_gib) + " must be > 0";
  if (!(a.seconds > 0)) return "--seconds " + std::to_string(a.seconds) + " must be > 0";
  for (int64_t m : a.ms)
    if (m < 1) return "--m " + std::to_string(m) + " must be >= 1";
  for (int64_t g : a.groups) {
    if (g < 1) return "--group_size " + std::to_string(g) + " must be >= 1";
    if (const std::string refusal = nibble::OptInGroupSizeRefusal(a.int8, a.bf16, g); !refusal.empty()) return refusal;
  }
  for (const std::string& sh : a.shapes) {
    long k = 0, n = 0;
    char end = 0;
    if (std::sscanf(sh.c_str(), "%ldx%ld%c", &k, &n, &end) != 2 || k < 1 || n < 1)
      return "--shapes: expected KxN with positive K and N, got \"" + sh + "\"";
    for (int64_t g : a.groups)
      if (k % g != 0) return "--shapes " + sh + ": K " + std::to_string(k) + " is not a multiple of --group_size " + std::to_string(g);
  }
  return "";
}
}  // namespace

Runner RegisterBench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "DRAM bandwidth and int4 GEMV/GEMM throughput against it");
  AddThreadsOption(cmd, &a->threads);
  cmd->add_option("--bandwidth_gib", a->bandwidth_gib, "Buffer streamed by the bandwidth test (GiB)")->capture_default_str();
  cmd->add_option("--passes", a->passes, "Bandwidth passes (best reported)")->capture_default_str();
  cmd->add_option("--shapes", a->shapes, "KxN weight shapes (K = in_features)")->capture_default_str();
  cmd->add_option("--group_size", a->groups, "Group sizes")->capture_default_str();
  cmd->add_option("--m", a->ms, "Rows of x (1 = decode GEMV)")->capture_default_str();
  cmd->add_option("--cycle_gib", a->cycle_gib, "Total size of the distinct weight matrices cycled through (GiB)")
      ->capture_default_str();
  cmd->add_option("--seconds", a->seconds, "Minimum timed seconds per case")->capture_default_str();
  cmd->add_flag("--no_bandwidth", a->skip_bandwidth, "Skip the bandwidth test (% column left empty)");
  cmd->add_flag("--no_gemm", a->skip_gemm, "Only measure bandwidth");
  cmd->add_flag("--int8_activations", a->int8,
                "Also time the opt-in W4A8 path (int8 activations) after each W4A32 case, same weights");
  cmd->add_flag("--bf16_activations", a->bf16,
                "Also time the opt-in bf16-activation path after each W4A32 case, same weights");
  return [a]() {
    if (const std::string err = CheckFlags(*a); !err.empty()) return UsageError(err);
    nibble::SetNumThreads(a->threads);
    const nibble::KernelDispatchReport k = nibble::DescribeKernels();
    std::printf("threads: %d | kernels: %s\n", nibble::NumThreads(), k.chosen.c_str());
    std::optional<nibble::ReadBandwidthProbe> probe;
    if (!a->skip_bandwidth) {
      auto p = nibble::ReadBandwidthProbe::Create(static_cast<int64_t>(a->bandwidth_gib * (1 << 30)));
      if (!p.ok()) return Fail(p.error().message);
      probe.emplace(std::move(*p));
      const nibble::BandwidthResult r = probe->Measure(a->passes);
      std::printf("DRAM read bandwidth: %.2f GB/s (%.2f GiB buffer, best of %d passes, %.3f s)\n", r.gb_per_s,
                  static_cast<double>(r.bytes) / (1 << 30), r.passes, r.seconds);
    }
    double peak = 0;  // bf16 dot-product peak of all threads, for the bf16 rows' %pk column
    if (a->bf16) {
      auto pk = nibble::MeasureBf16DotPeak(0.3);
      if (pk.ok()) {
        peak = pk->gflop_per_s;
        std::printf("bf16 dot-product peak (vdpbf16ps, %d threads): %.1f GFLOP/s (%.1f per thread)\n", pk->threads,
                    pk->gflop_per_s, pk->per_thread_gflop_per_s);
      } else {
        std::printf("bf16 dot-product peak: not measured: %s\n", pk.error().message.c_str());
      }
    }
    if (a->skip_gemm) return 0;
    // Each case's % is against the bandwidth measured right before it (column bw): the machine's
    // bandwidth can move by tens of percent between the first measurement and a case a minute later.
    std::printf("cyc/w: time-stamp counter ticks per weight of W per call x threads (best round); the TSC ticks\n"
                "at the CPU's nominal frequency (TSC GHz on the last line), not the core clock\n");
    std::printf("%-11s %5s %4s %-26s %6s %9s %10s %9s %7s %7s %9s %10s %6s %7s\n", "KxN", "g", "M", "path", "mats",
                "MB/mat", "ms/call", "GB/s", "bw", "%bw", "GFLOP/s", "mean GB/s", "%pk", "cyc/w");
    double tsc_ghz = 0;
    double bw_min = 1e300, bw_max = 0;
    for (const std::string& sh : a->shapes) {
      nibble::GemmBenchCase c;
      if (std::sscanf(sh.c_str(), "%ldx%ld", &c.k, &c.n) != 2) return Fail("--shapes: \"" + sh + "\"");  // CheckFlags'd
      for (int64_t g : a->groups)
        for (int64_t m : a->ms) {
          c.group_size = g;
          c.m = m;
          for (int act : {0, 1, 2}) {  // fp32, int8, bf16 activations
            if ((act == 1 && !a->int8) || (act == 2 && !a->bf16)) continue;
            c.int8_activations = act == 1;
            c.bf16_activations = act == 2;
            const double bw = probe ? probe->Measure(a->passes).gb_per_s : 0.0;
            bw_min = std::min(bw_min, bw);
            bw_max = std::max(bw_max, bw);
            auto r = nibble::BenchW4Gemm(c, static_cast<int64_t>(a->cycle_gib * (1 << 30)), a->seconds);
            if (!r.ok()) return Fail(r.error().message);
            char bws[16] = "-", pct[16] = "-", pks[16] = "-";
            if (c.bf16_activations && peak > 0) std::snprintf(pks, sizeof pks, "%.1f", 100.0 * r->gflop_per_s / peak);
            if (bw > 0) {
              std::snprintf(bws, sizeof bws, "%.1f", bw);
              std::snprintf(pct, sizeof pct, "%.1f", 100.0 * r->weight_gb_per_s / bw);
            }
            char cyc[16] = "-";
            if (r->tsc_per_call > 0) std::snprintf(cyc, sizeof cyc, "%.3f", r->TscCyclesPerWeight());
            tsc_ghz = r->tsc_ghz;
            std::printf("%-11s %5ld %4ld %-26s %6ld %9.2f %10.3f %9.2f %7s %7s %9.1f %10.2f %6s %7s\n", sh.c_str(), g,
                        m, r->path.c_str(), r->matrices, r->weight_bytes / 1e6, r->seconds_per_call * 1e3,
                        r->weight_gb_per_s, bws, pct, r->gflop_per_s, r->weight_bytes / r->mean_seconds_per_call / 1e9,
                        pks, cyc);
            std::fflush(stdout);
          }
        }
    }
    if (tsc_ghz > 0)
      std::printf("TSC: %.3f GHz (ticks per ns over the timed rounds: the nominal frequency; cyc/w counts these ticks)\n",
                  tsc_ghz);
    if (bw_max > 0)
      std::printf("DRAM read bandwidth before the cases: %.2f - %.2f GB/s (best of %d passes each)\n", bw_min, bw_max,
                  a->passes);
    return 0;
  };
}

}  // namespace nibble_cli
