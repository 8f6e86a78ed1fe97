// `nibble generate`: stream a continuation of a prompt; prefill / decode tokens/s on stderr.
// Ctrl-C / SIGTERM (CancelOnSignal, installed once the model is loaded) stops generation at the
// next token: the text so far stays printed, "stop: cancelled", exit 130 / 143; during the prompt's
// prefill it is a "cancelled" error with the same exit code.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"
#include "support/cancel_signal.h"
#include "support/chat_loop.h"
#include "support/flags.h"

namespace nibble_cli {

namespace {
struct GenerateArgs {
  std::string model;
  std::string prompt_file;
  nibble::GenerateOptions opt;
  CLI::Option* seed = nullptr;
  int threads = 0;
  nibble::ActivationType activations = nibble::ActivationType::kAuto;
  nibble::TokenizerType tokenizer = nibble::TokenizerType::kAuto;
  bool int8 = false;  // aliases of --activations int8 / bf16
  bool bf16 = false;
  bool chat = false;           // --chat: interactive conversation through the chat template
  std::string system;          // --system
  std::string chat_template;   // --chat_template FILE
  std::string chat_kwargs;     // --chat_template_kwargs JSON
  KvArgs kv;
};

void AddSamplingFlags(CLI::App* cmd, GenerateArgs& a) {
  nibble::SamplingOptions& s = a.opt.sampling;
  cmd->add_option("--temperature", s.temperature,
                  "Sampling temperature, applied before the top-k / top-p / min-p cuts; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top_k", s.top_k, "Keep the k most likely tokens; 0 = all")->capture_default_str();
  cmd->add_option("--top_p", s.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--min_p", s.min_p, "Keep tokens with p >= min_p * p(most likely), in [0, 1]; 0 = off")
      ->capture_default_str();
  cmd->add_option("--repeat_penalty", s.repeat_penalty,
                  "Penalise tokens among the last --repeat_last_n (llama.cpp: logit / p if > 0, else * p); 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat_last_n", s.repeat_last_n, "Tokens the repeat penalty looks back over; 0 = off, -1 = all")
      ->capture_default_str();
  cmd->add_option("--presence_penalty", s.presence_penalty,
                  "OpenAI's: subtract this from the logit of every token already generated, in [-2, 2]; 0 = off")
      ->capture_default_str();
  cmd->add_option("--frequency_penalty", s.frequency_penalty,
                  "OpenAI's: subtract this times its count from the logit of every generated token, in [-2, 2]; 0 = off")
      ->capture_default_str();
  // Parsed here: CLI11 wraps "-1" to 2^64 - 1 and clamps a value past 2^64 - 1 to it.
  a.seed = cmd->add_option_function<std::string>(
      "--seed",
      [&s](const std::string& v) {
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), s.seed);
        if (ec != std::errc{} || end != v.data() + v.size())
          throw CLI::ValidationError("--seed", "expected an integer in [0, 18446744073709551615], got \"" + v + "\"");
      },
      "Sampling seed (default: a random one, printed on stderr)");
}

// The prompt must fit the context before it is echoed (an error, nothing on stdout). Generation
// ends when the context is full: the last token is sampled from the last position's logits, so a
// prompt of P tokens leaves room for ctx_size - P + 1 new ones (a warning).
std::string CheckPromptFits(const nibble::Model& model, const nibble::GenerateOptions& o, int64_t ctx) {
  auto ids = nibble::PromptTokens(model, o.prompt);
  if (!ids.ok()) return ids.error().message;
  const int64_t p = static_cast<int64_t>(ids->size());
  if (p > ctx)
    return "the prompt is " + std::to_string(p) + " tokens, more than the context of " + std::to_string(ctx) +
           " positions (--ctx_size)";
  const int64_t room = ctx - p + 1;
  if (o.max_new_tokens > room)
    std::fprintf(stderr,
                 "warning: -n %lld exceeds the context: the prompt takes %lld of %lld positions "
                 "(--ctx_size), so at most %lld tokens will be generated\n",
                 static_cast<long long>(o.max_new_tokens), static_cast<long long>(p), static_cast<long long>(ctx),
                 static_cast<long long>(room));
  return "";
}

void PrintStats(const nibble::GenerateStats& s) {
  const int64_t decoded = s.generated_tokens > 0 ? s.generated_tokens - 1 : 0;
  const std::string reason = s.stop_reason == nibble::StopReason::kStopString ? "stop string \"" + s.stop_string + "\""
                                                                              : nibble::StopReasonName(s.stop_reason);
  std::fprintf(stderr,
               "\nprefill: %lld tokens in %.3f s (%.1f tokens/s) | decode: %lld tokens in %.3f s (%.1f tokens/s) | "
               "stop: %s | threads: %d\n",
               static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
               s.prefill_seconds > 0 ? s.prompt_tokens / s.prefill_seconds : 0.0, static_cast<long long>(decoded),
               s.decode_seconds, s.decode_seconds > 0 ? decoded / s.decode_seconds : 0.0, reason.c_str(),
               nibble::NumThreads());
}

int RunChat(const GenerateArgs& a, const nibble::Model& model, const nibble::ChatTemplate& tmpl) {
  std::fprintf(stderr, "seed: %llu | chat template: %s\n", static_cast<unsigned long long>(a.opt.sampling.seed),
               tmpl.origin.c_str());
  ChatLoopOptions o;
  o.system = a.system;
  o.extra_vars_json = a.chat_kwargs;
  o.max_new_tokens = a.opt.max_new_tokens;
  o.sampling = a.opt.sampling;
  o.prompt_marker = ::isatty(0) ? "> " : "";  // as llama-cli: a marker on a terminal, none when piped
  o.session.context = a.kv.ctx_size;
  o.session.max_memory = a.kv.max_memory;
  return RunChatLoop(model, tmpl, o, stdin, stdout);
}

// Every flag is checked before anything is loaded (a 7B takes a minute to load): the sampling
// values by the library's rules, the stop strings, the chat template (read, parsed and rendered
// once with the system message and the kwargs). Returns the exit code, or -1 to go on.
int CheckFlags(GenerateArgs& a, nibble::ChatTemplate* tmpl) {
  if (!a.chat && (!a.system.empty() || !a.chat_template.empty() || !a.chat_kwargs.empty()))
    return UsageError("--system, --chat_template and --chat_template_kwargs need --chat");
  if (const nibble::Status v = nibble::ValidateGenerateOptions(a.opt, "--"); !v.ok()) return UsageError(v.error().message);
  if (a.chat && a.opt.max_new_tokens < 1)
    return UsageError("--max_new_tokens (-n) " + std::to_string(a.opt.max_new_tokens) + " must be >= 1 with --chat");
  if (const nibble::Status v = nibble::ValidateChatTemplateVars(a.chat_kwargs); !v.ok())
    return UsageError("--chat_template_kwargs: " + v.error().message);
  if (!a.prompt_file.empty()) {
    if (const std::string err = ReadTextFile(a.prompt_file, &a.opt.prompt); !err.empty()) return Fail("-f: " + err);
    if (!a.opt.prompt.empty() && a.opt.prompt.back() == '\n') a.opt.prompt.pop_back();  // as llama.cpp's -f
  }
  // The template needs only tokenizer_config.json; a missing model directory is left to Load.
  if (a.chat && (std::filesystem::is_directory(a.model) || !a.chat_template.empty())) {
    auto t = nibble::LoadChatTemplate(a.model, a.chat_template);
    if (!t.ok()) return Fail(t.error().message);
    std::vector<nibble::ChatMessage> probe;
    if (!a.system.empty()) probe.push_back({"system", a.system});
    probe.push_back({"user", "Hello"});
    if (auto r = nibble::RenderChat(*t, probe, true, a.chat_kwargs); !r.ok()) return Fail(r.error().message);
    *tmpl = std::move(t).value();
  }
  return -1;
}

int RunGenerate(GenerateArgs& a) {
  nibble::ChatTemplate tmpl;
  if (const int rc = CheckFlags(a, &tmpl); rc >= 0) return rc;
  nibble::SetNumThreads(a.threads);
  nibble::LoadOptions lo;
  lo.activations = a.activations;
  lo.tokenizer = a.tokenizer;
  ApplyKvArgs(a.kv, &lo);
  if (a.int8) lo.activations = nibble::ActivationType::kInt8;
  if (a.bf16) lo.activations = nibble::ActivationType::kBf16;
  auto model = nibble::Model::Load(a.model, lo);
  if (!model.ok()) return Fail(model.error().message);
  PrintWarnings(a.model, (*model)->info().warnings);
  std::fprintf(stderr, "%s\n", nibble::LoadSummary((*model)->info()).c_str());
  if (const std::string err = ReportActivations(a.model, lo.activations, (*model)->info()); !err.empty()) return Fail(err);
  if (a.kv.ctx_size == 0) a.kv.ctx_size = nibble::DefaultContextSize(**model);
  if (const std::string err = ReportKvMemory(**model, a.kv.ctx_size, a.kv); !err.empty()) return Fail(err);
  if (a.seed->count() == 0) a.opt.sampling.seed = std::random_device{}();
  if (a.chat) {
    if (tmpl.origin.empty()) {  // the directory appeared between the check and the load
      auto t = nibble::LoadChatTemplate(a.model, a.chat_template);
      if (!t.ok()) return Fail(t.error().message);
      tmpl = std::move(t).value();
    }
    return RunChat(a, **model, tmpl);
  }
  if (const std::string err = CheckPromptFits(**model, a.opt, a.kv.ctx_size); !err.empty()) return Fail(err);
  nibble::SessionOptions so;
  so.context = a.kv.ctx_size;
  so.max_memory = a.kv.max_memory;
  auto session = nibble::Session::Create(**model, so);
  if (!session.ok()) return Fail(session.error().message);
  std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(a.opt.sampling.seed));
  std::fwrite(a.opt.prompt.data(), 1, a.opt.prompt.size(), stdout);  // echo, as llama.cpp does
  std::fflush(stdout);
  CancelOnSignal on_signal;
  a.opt.cancel = on_signal.token();
  auto stats = nibble::Generate(**session, a.opt, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  if (!stats.ok()) return FailStatus(stats.error());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  PrintStats(*stats);
  return stats->stop_reason == nibble::StopReason::kCancelled ? CancelledExitCode(CancelSignal()) : 0;
}
}  // namespace

Runner RegisterGenerate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams tokens as they come)");
  cmd->add_option("--model,-m,--model_dir", args->model, "Model directory (HF layout: config.json, safetensors, tokenizer.model or tokenizer.json)")->required();
  CLI::Option* prompt = cmd->add_option("--prompt,-p", args->opt.prompt, "Prompt text (empty: start from BOS alone)");
  cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file (one trailing newline dropped)")
      ->excludes(prompt);
  cmd->add_option("-n,--max_new_tokens", args->opt.max_new_tokens, "Tokens to generate (per reply with --chat)")->capture_default_str();
  cmd->add_flag("--chat", args->chat,
                "Interactive chat: one user turn per stdin line (EOF ends), rendered with the model's chat template; "
                "the KV cache is kept across turns")
      ->excludes(prompt)
      ->excludes("--file");
  cmd->add_option("--system", args->system, "System message for --chat");
  cmd->add_option("--chat_template", args->chat_template,
                  "Jinja chat template file for --chat (default: tokenizer_config.json's chat_template)");
  cmd->add_option("--chat_template_kwargs", args->chat_kwargs,
                  "More chat template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  AddSamplingFlags(cmd, *args);
  cmd->add_option("--stop", args->opt.stop,
                  "Stop when the text contains this string (not printed); several strings: --stop A B or --stop A --stop B");
  cmd->add_option("--warmup", args->opt.warmup, "Untimed prompt prefills before the timed run (for benchmarks)")->capture_default_str();
  AddThreadsOption(cmd, &args->threads);
  AddActivationsOption(cmd, &args->activations);
  AddKvOptions(cmd, &args->kv, "default min(max_position_embeddings, 8192)");
  AddTokenizerOption(cmd, &args->tokenizer);
  cmd->add_flag("--int8_activations", args->int8, "Same as --activations int8")->excludes("--activations");
  cmd->add_flag("--bf16_activations", args->bf16, "Same as --activations bf16")
      ->excludes("--int8_activations")
      ->excludes("--activations");
  return [args]() { return RunGenerate(*args); };
}

}  // namespace nibble_cli
