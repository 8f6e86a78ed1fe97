// `nibble inspect DIR`: format, per-layer resolved config and the rule that produced it, sizes.
// `nibble inspect --kernels`: the W4A32 kernel ISA chosen at run time and why the others were not.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"
#include "support/eval_output.h"
#include "support/load_env.h"

namespace nibble_cli {

namespace {
// `inspect --kernels`: what the dispatch chose on this CPU and why, as text or JSON.
void ShowKernels(bool as_json) {
  const nibble::KernelDispatchReport k = nibble::DescribeKernels();
  if (as_json) {
    nlohmann::ordered_json j;
    j["chosen"] = k.chosen;
    j["cpu_vendor"] = k.cpu_vendor;
    j["cpu_family"] = k.cpu_family;
    j["cpu_flags"] = k.cpu_flags;
    j["NIBBLE_ISA"] = k.override_value;
    if (!k.override_message.empty()) j["override_message"] = k.override_message;
    nlohmann::ordered_json c = nlohmann::ordered_json::array();
    for (const auto& x : k.candidates)
      c.push_back({{"isa", x.isa}, {"compiled", x.compiled}, {"supported", x.supported}, {"chosen", x.chosen},
                   {"reason", x.reason}});
    j["candidates"] = c;
    j["int8_activations_kernel"] = k.int8_kernel;
    j["int8_activations_reason"] = k.int8_reason;
    j["bf16_activations_kernel"] = k.bf16_act_kernel;
    j["bf16_activations_reason"] = k.bf16_act_reason;
    j["bf16_decode_chunk_min_k"] = k.bf16_decode_chunk_min_k;
    j["int8_decode_chunk_min_k"] = k.int8_decode_chunk_min_k;
    j["l1d_bytes"] = k.l1d_bytes;
    j["bf16_matmul_min_rows"] = k.bf16_matmul_min_rows;
    j["bf16_matmul_amx"] = k.bf16_matmul_amx;
    j["bf16_prefill_sgemm"] = k.bf16_prefill_sgemm;
    j["bf16_dense_linears"] = k.bf16_dense;
    j["vec_ops"] = k.vec_ops;
    j["decode_prefetch"] = k.row_prefetch;
    j["decode_prefetch_reason"] = k.row_prefetch_reason;
    if (!k.row_prefetch_message.empty()) j["decode_prefetch_message"] = k.row_prefetch_message;
    j["openmp_wait"] = DescribeOpenMpWait();
    j["openblas_core"] = DescribeBlasCore();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("int4 kernels: %s\ncpu: %s family %d | %s\nNIBBLE_ISA: %s%s%s\n", k.chosen.c_str(), k.cpu_vendor.c_str(),
                k.cpu_family, k.cpu_flags.c_str(), k.override_value.empty() ? "(unset)" : k.override_value.c_str(),
                k.override_message.empty() ? "" : " -> ", k.override_message.c_str());
    for (const auto& x : k.candidates)
      std::printf("  %-7s %-8s %s\n", x.isa.c_str(), x.chosen ? "chosen" : (x.supported ? "skipped" : "rejected"),
                  x.reason.c_str());
    std::printf("activations (default --activations auto): bf16 in every int4 linear whose group size is a "
                "multiple of 32, fp32 in the others\n");
    std::printf("bf16 activations: %s below %lld rows (%s), %s from %lld (%s)\n", k.bf16_act_kernel.c_str(),
                static_cast<long long>(k.bf16_matmul_min_rows), k.bf16_act_reason.c_str(),
                k.bf16_prefill_sgemm ? "fp32 sgemm on the bf16-rounded rows" : "bf16 matmul",
                static_cast<long long>(k.bf16_matmul_min_rows), k.bf16_matmul_amx ? "AMX" : "no AMX");
    std::printf("decode loops at g = 128: %d weight rows at a time, in chunks of %lld weights, from K = %lld (bf16) "
                "and %lld (int8): a row's activations past 3/4 of the %lld KiB L1 data cache\n",
                k.decode_chunk_rows, static_cast<long long>(k.decode_chunk_weights),
                static_cast<long long>(k.bf16_decode_chunk_min_k), static_cast<long long>(k.int8_decode_chunk_min_k),
                static_cast<long long>(k.l1d_bytes / 1024));
    std::printf("int8 activations (--activations int8): %s (%s)\n", k.int8_kernel.c_str(), k.int8_reason.c_str());
    std::printf("bf16 dense linears: %s\n", k.bf16_dense.c_str());
    std::printf("row ops (softmax, SiLU, AWQ loss): %s\n", k.vec_ops.c_str());
    std::printf("decode prefetch (NIBBLE_PREFETCH=nta|t0): %s (%s)%s%s\n", k.row_prefetch.c_str(),
                k.row_prefetch_reason.c_str(), k.row_prefetch_message.empty() ? "" : " -> ",
                k.row_prefetch_message.c_str());
    std::printf("openmp wait: %s\n", DescribeOpenMpWait().c_str());
    std::printf("openblas core (GPTQ's factorisations; OPENBLAS_CORETYPE): %s\n", DescribeBlasCore().c_str());
  }
}

// Stored bits per weight of one linear (scales and zero points included), counted as SizeSummary.
double BitsPerWeight(const nibble::InspectReport::Layer& l) {
  nibble::SizeSummary one;
  one.quantized_weights = l.n * l.k;
  one.quantized_bytes = l.stored_bytes;
  return one.bits_per_weight();
}
// `inspect --engines`: per linear what each engine resolves ("=" where it agrees with the file),
// the disagreements with the flag that avoids each, and tensor-parallel readiness.
void PrintEngines(const nibble::InspectReport& rep, bool all) {
  if (rep.engines.empty()) {
    std::printf("engines: %s is a dense checkpoint; every engine reads it in float\n", rep.dir.c_str());
    return;
  }
  // An engine that loads no linear at all (ORT GenAI and compressed-tensors) is one line below,
  // not a reason to list every linear.
  std::vector<bool> reads_nothing(rep.engines.size(), !rep.engine_rows.empty());
  for (const auto& row : rep.engine_rows)
    for (size_t e = 0; e < row.agrees.size() && e < reads_nothing.size(); ++e)
      if (row.agrees[e] || row.readings[e] != "fails to load") reads_nothing[e] = false;
  auto agreed = [&reads_nothing](const nibble::InspectReport::EngineRow& row) {
    for (size_t e = 0; e < row.agrees.size(); ++e)
      if (!row.agrees[e] && !(e < reads_nothing.size() && reads_nothing[e])) return false;
    return true;
  };
  int64_t shown = 0;
  for (const auto& row : rep.engine_rows) shown += all || !agreed(row) ? 1 : 0;
  if (shown > 0) {
    std::printf("%-36s %-22s", "layer", "the file means");
    for (size_t e = 1; e < rep.engines.size(); ++e) std::printf(" %-24s", rep.engines[e].c_str());
    std::printf("\n");
  }
  for (const auto& row : rep.engine_rows) {
    if (!all && agreed(row)) continue;
    std::printf("%-36s %-22s", row.name.c_str(), row.meant.c_str());
    for (size_t e = 1; e < row.readings.size(); ++e)
      std::printf(" %-24s", row.agrees[e] ? "=" : row.readings[e].c_str());
    std::printf("\n");
  }
  if (!all)
    std::printf("(%lld of %zu linears where an engine disagrees; --all lists every one)\n", static_cast<long long>(shown),
                rep.engine_rows.size());
  if (rep.engine_disagreements.empty()) std::printf("every engine resolves every linear as the file means\n");
  for (const auto& d : rep.engine_disagreements) std::printf("disagreement: %s\n", d.c_str());
  for (const auto& t : rep.tensor_parallel)
    std::printf("tensor parallel %d: %s%s\n", t.tp, t.ok ? "ok" : "fails: ", t.failure.c_str());
}

}  // namespace

Runner RegisterInspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto kernels = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "Show a checkpoint's format and per-layer quantization");
  cmd->add_option("dir", *dir, "Model directory (optional with --kernels)");
  cmd->add_flag("--json", *as_json, "Machine-readable output");
  cmd->add_flag("--kernels", *kernels, "Show the int4 kernel ISA chosen (CPUID + XCR0, NIBBLE_ISA) and why");
  auto engines = std::make_shared<bool>(false);
  cmd->add_flag("--engines", *engines,
                "What vLLM, ONNX Runtime GenAI, Transformers and nibble resolve per linear, their disagreements, "
                "and tensor-parallel readiness (TP 1, 2, 4, 8)");
  auto all = std::make_shared<bool>(false);
  cmd->add_flag("--all", *all, "With --engines: list every linear, not only those where an engine disagrees");
  return [dir, as_json, kernels, engines, all]() {
    if (*kernels) {
      ShowKernels(*as_json);
      if (dir->empty()) return 0;
    }
    if (dir->empty()) return UsageError("inspect: a model directory is required (or --kernels)");
    if (*all && !*engines) return UsageError("inspect: --all goes with --engines");
    auto rep = nibble::Inspect(*dir);
    if (!rep.ok()) return Fail(rep.error().message);
    PrintWarnings(*dir, rep->warnings);
    if (*as_json) {
      std::printf("%s\n", nibble::InspectJson(*rep, *engines).c_str());
      return 0;
    }
    std::string props;
    for (const auto& [key, value] : rep->format_properties) props += " | " + key + ": " + value;
    std::printf("%s\nformat: %s%s | torch_dtype: %s | tensors on disk: %.2f MB\n", rep->dir.c_str(), rep->format.c_str(),
                props.c_str(), rep->torch_dtype.c_str(), rep->total_tensor_bytes / 1e6);
    // With --engines the engines table is the per-layer table (its "the file means" column is
    // the scheme); the layout table is not printed a second time.
    if (!*engines) {
      std::printf("%-36s %-22s %6s %6s %10s %7s  %s\n", "layer", "scheme", "N", "K", "bytes", "bits/w", "rule");
      for (const auto& l : rep->layers)
        std::printf("%-36s %-22s %6lld %6lld %10lld %7.2f  %s\n", l.name.c_str(), l.scheme.c_str(), static_cast<long long>(l.n),
                    static_cast<long long>(l.k), static_cast<long long>(l.stored_bytes), BitsPerWeight(l), l.rule.c_str());
    }
    std::printf("size: %s\n", nibble::FormatSize(rep->size).c_str());
    if (*engines) PrintEngines(*rep, *all);
    return 0;
  };
}

}  // namespace nibble_cli
