// `nibble generate`: stream a continuation of a prompt; prefill / decode tokens/s on stderr.
#include <cstdio>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"

namespace nibble_cli {

namespace {
struct GenerateArgs {
  std::string model;
  nibble::GenerateOptions opt;
  int threads = 0;
  bool int8 = false;
  bool bf16 = false;
};
}  // namespace

Runner RegisterGenerate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams tokens as they come)");
  cmd->add_option("--model,-m", args->model, "Model directory (HF layout: config.json, safetensors, tokenizer.model)")->required();
  cmd->add_option("--prompt,-p", args->opt.prompt, "Prompt text (empty: start from BOS alone)");
  cmd->add_option("-n,--max_new_tokens", args->opt.max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", args->opt.sampling.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top_k", args->opt.sampling.top_k, "Keep the k most likely tokens; 0 = all")->capture_default_str();
  cmd->add_option("--top_p", args->opt.sampling.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--seed", args->opt.sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--warmup", args->opt.warmup, "Untimed prompt prefills before the timed run (for benchmarks)")->capture_default_str();
  cmd->add_option("--threads,-t", args->threads, "Worker threads (0 = all cores)")->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_flag("--int8_activations", args->int8,
                "Opt-in W4A8: int8 activations in the int4 linears (faster decode, costs perplexity: measure it "
                "with `nibble perplexity --int8_activations`)");
  cmd->add_flag("--bf16_activations", args->bf16,
                "Opt-in bf16 activations in the int4 linears (W4A16 as bf16 engines run it; faster decode of models "
                "larger than the cache on CPUs with avx512_bf16; measure its perplexity cost with "
                "`nibble perplexity --bf16_activations`)")
      ->excludes("--int8_activations");
  return [args]() {
    nibble::SetNumThreads(args->threads);
    nibble::LoadOptions lo;
    if (args->int8) lo.activations = nibble::ActivationType::kInt8;
    if (args->bf16) lo.activations = nibble::ActivationType::kBf16;
    auto model = nibble::Model::Load(args->model, lo);
    if (!model.ok()) return Fail(model.error().message);
    const int64_t n = (*model)->info().activation_linears;
    if (args->int8) {
      if (n == 0) return Fail(Int8NotServed(args->model));
      std::fprintf(stderr, "activations: int8 (W4A8) in %lld int4 linears\n", static_cast<long long>(n));
      const std::string kept = KeptFp32Note(true, (*model)->info().int4_linears, n);
      if (!kept.empty()) std::fprintf(stderr, "activations: %s\n", kept.c_str());
    }
    if (args->bf16) {
      if (n == 0) return Fail(Bf16NotServed(args->model));
      std::fprintf(stderr, "activations: bf16 in %lld int4 linears (kernel: %s)\n", static_cast<long long>(n),
                   nibble::DescribeKernels().bf16_act_kernel.c_str());
      const std::string kept = KeptFp32Note(false, (*model)->info().int4_linears, n);
      if (!kept.empty()) std::fprintf(stderr, "activations: %s\n", kept.c_str());
    }
    std::fwrite(args->opt.prompt.data(), 1, args->opt.prompt.size(), stdout);  // echo, as llama.cpp does
    auto stats = nibble::Generate(**model, args->opt, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    if (!stats.ok()) return Fail(stats.error().message);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const auto& s = *stats;
    const int64_t decoded = s.generated_tokens > 0 ? s.generated_tokens - 1 : 0;
    std::fprintf(stderr,
                 "\nprefill: %lld tokens in %.3f s (%.1f tokens/s) | decode: %lld tokens in %.3f s (%.1f tokens/s) | "
                 "stop: %s | threads: %d\n",
                 static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
                 s.prefill_seconds > 0 ? s.prompt_tokens / s.prefill_seconds : 0.0, static_cast<long long>(decoded),
                 s.decode_seconds, s.decode_seconds > 0 ? decoded / s.decode_seconds : 0.0, s.stop_reason.c_str(),
                 nibble::NumThreads());
    return 0;
  };
}

}  // namespace nibble_cli
