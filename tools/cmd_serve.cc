// `nibble serve`: the OpenAI-compatible HTTP server (<nibble/serve.h>); this file only reads
// the flags, starts the server and drains it on SIGTERM / SIGINT.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nibble/serve.h>

#include "commands.h"
#include "support/flags.h"

namespace nibble_cli {

namespace {

struct ServeArgs {
  nibble::ServeOptions o;
  std::string api_key_file;
  KvArgs kv;  // --ctx_size (per sequence), --kv_dtype, --max_memory (all slots), --weight_cache
};

// The key file's first line, trailing whitespace dropped (a key itself has none).
std::string ReadKeyFile(const std::string& path, std::string* key) {
  std::ifstream in(path);
  if (!in) return "--api_key_file " + path + ": no such file or not readable";
  std::getline(in, *key);
  while (!key->empty() && std::isspace(static_cast<unsigned char>(key->back()))) key->pop_back();
  if (key->empty()) return "--api_key_file " + path + ": the first line (the key) is empty";
  return "";
}

int RunServe(ServeArgs& a) {
  if (!a.api_key_file.empty()) {
    if (const std::string err = ReadKeyFile(a.api_key_file, &a.o.api_key); !err.empty()) return UsageError(err);
  }
  ApplyKvArgs(a.kv, &a.o.load);
  if (a.kv.ctx_size > 0) a.o.ctx_size = a.kv.ctx_size;
  a.o.max_memory = a.kv.max_memory;
  if (const nibble::Status st = nibble::ValidateServeOptions(a.o); !st.ok()) return UsageError(st.error().message);
  // SIGTERM / SIGINT are taken by sigwait below: blocked before any thread starts, so that
  // every thread inherits the mask and none is interrupted.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  auto on_listening = [&a](int port) {
    std::fprintf(stderr, "nibble serve: listening on http://%s:%d (loading %s)\n", a.o.host.c_str(), port, a.o.model_dir.c_str());
    std::fflush(stderr);
  };
  // What generate and perplexity print once the model is loaded, and their activations refusal.
  std::string refusal;
  auto on_loaded = [&a, &refusal](const nibble::Model& model) {
    PrintWarnings(a.o.model_dir, model.info().warnings);
    std::fprintf(stderr, "%s\n", nibble::LoadSummary(model.info()).c_str());
    refusal = ReportActivations(a.o.model_dir, a.o.load.activations, model.info());
    std::fflush(stderr);
    return refusal.empty() ? nibble::Status::Ok() : nibble::Status(nibble::MakeError(refusal));
  };
  auto server = nibble::Server::Start(a.o, on_listening, on_loaded);
  if (!server.ok()) return refusal.empty() ? FailStatus(server.error()) : Fail(refusal);
  std::fprintf(stderr, "nibble serve: ready on port %d: %d slots, ctx_size %lld, chunk %lld%s\n", (*server)->port(),
               a.o.parallel, static_cast<long long>((*server)->context_size()), static_cast<long long>(a.o.chunk),
               a.o.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "nibble serve: %s: draining (running requests finish, new ones get 503)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Drain();
  (*server)->Wait();
  std::fprintf(stderr, "nibble serve: stopped\n");
  return 0;
}

}  // namespace

Runner RegisterServe(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  nibble::ServeOptions& o = a->o;
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)");
  cmd->add_option("--model,-m", o.model_dir, "Model directory")->required();
  cmd->add_option("--host", o.host, "Address to bind (127.0.0.1: this machine only)")->capture_default_str();
  cmd->add_option("--port", o.port, "TCP port (0 = any free port, printed)")->capture_default_str();
  cmd->add_option("--parallel,-P", o.parallel, "Sequences decoded together (slots)")->capture_default_str();
  cmd->add_option("--chunk", o.chunk, "Prompt tokens per batched step (chunked prefill)")->capture_default_str();
  CLI::Option* key = cmd->add_option("--api_key", o.api_key, "Require this key (Authorization: Bearer / X-Api-Key)");
  cmd->add_option("--api_key_file", a->api_key_file, "Read the key from the first line of this file")->excludes(key);
  AddThreadsOption(cmd, &o.threads, "Compute threads (0 = all cores)");
  AddActivationsOption(cmd, &o.load.activations);
  AddTokenizerOption(cmd, &o.load.tokenizer);
  AddKvOptions(cmd, &a->kv,
               "per sequence, default " + std::to_string(o.ctx_size) +
                   " (at most max_position_embeddings); --max_memory bounds the KV caches of all --parallel slots");
  cmd->add_option("--chat_template", o.chat_template, "Jinja chat template file (default: the model's)");
  cmd->add_option("--alias", o.alias, "Model id reported by /v1/models (default: the directory name)");
  cmd->add_option("--timeout", o.timeout_seconds, "Seconds a request may run before it is ended")->capture_default_str();
  cmd->add_option("--max_queue", o.max_queue, "Sequences waiting for a slot before new requests get 429")->capture_default_str();
  return [a]() { return RunServe(*a); };
}

}  // namespace nibble_cli
