// `nibble bench-model`: llama-bench for whole models. pp<P>: one prefill of P token ids from an
// empty context; tg<N>: N single-token steps from an empty context. Ids are random (the first is
// BOS when the tokenizer adds one), drawn from a fixed seed per repetition, so every model, mode
// and thread count sees the same trace. Sampling and tokenization are not timed. tokens/s are
// reported as median ± sample standard deviation over the repetitions, after one untimed warmup.
// With --parallel P > 1, tg runs P sequences together (Session StepBatch: one decode step of all
// of them, each weight read once), each with its own trace; t/s counts the tokens of all P.
// With --chunk C, every tg test also runs mixed (continuous batching with chunked prefill): P
// decoding sequences (P = 1 too) and, every --chunk_every steps, a C-token prefill chunk of one
// more sequence in the same step; t/s still counts decode tokens only, so it compares with the
// decode-only row (the JSON adds the chunks' tokens/s).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"

namespace nibble_cli {

namespace {
constexpr uint64_t kTraceSeed = 1234;

struct BenchModelArgs {
  std::vector<std::string> models;
  std::vector<int64_t> n_prompt = {512};
  std::vector<int64_t> n_gen = {128};
  int repetitions = 3;
  std::vector<int> threads = {0};
  std::vector<int64_t> parallel = {1};
  std::vector<std::string> activations = {"auto"};
  int64_t chunk = 0;        // prefill chunk tokens in mixed tg steps; 0 = no mixed tests
  int64_t chunk_every = 4;  // steps between two chunks
  bool json = false;
  KvArgs kv;  // --ctx_size 0: the longest test's positions
};

struct ModelDesc {
  std::string dir, name, format, model_type;
  int64_t size_bytes = 0, params = 0;
};

struct TestResult {
  const ModelDesc* model = nullptr;
  std::string activations, test;
  int threads = 0;
  int64_t n_prompt = 0, n_gen = 0, parallel = 1;
  int64_t chunk = 0, chunk_every = 0;  // mixed tg: a chunk-token prefill every chunk_every steps
  std::vector<double> tps;  // tokens/s per repetition (decode tokens in a mixed test)
  std::vector<double> chunk_tps;  // mixed tg: prefill chunk tokens/s per repetition
  std::vector<double> ns;   // nanoseconds per repetition
  int64_t n_ctx = 0;        // each session's ctx_size
  int64_t kv_bytes = 0;     // KV bytes of the sessions at their full ctx_size (all `parallel` of them)
  std::string kv_type;
};

struct Summary {
  double median = 0, mean = 0, sd = 0, min = 0, max = 0;
};

Summary Summarise(std::vector<double> v) {
  Summary s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  for (double x : v) s.mean += x / n;
  for (double x : v) s.sd += n > 1 ? (x - s.mean) * (x - s.mean) / (n - 1) : 0.0;
  s.sd = std::sqrt(s.sd);
  s.min = v.front();
  s.max = v.back();
  return s;
}

ModelDesc Describe(const std::string& dir, const nibble::ModelInfo& info) {
  ModelDesc d;
  d.dir = dir;
  d.name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (d.name.empty()) d.name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  d.format = info.int4_linears > 0 ? info.weight_format + " int4" : "dense " + info.torch_dtype;
  d.model_type = info.model_type;
  d.params = info.num_parameters;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") d.size_bytes += static_cast<int64_t>(e.file_size(ec));
  return d;
}

// The ids of repetition `rep`: `count` uniform over the vocabulary, the first BOS when given.
std::vector<int32_t> Trace(int64_t count, int64_t vocab, int32_t bos, int rep) {
  std::mt19937_64 rng(kTraceSeed + static_cast<uint64_t>(rep));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(count));
  for (int32_t& x : t) x = id(rng);
  if (bos >= 0 && !t.empty()) t[0] = bos;
  return t;
}

// Seconds for the prompt (one Prefill) or the generation (one Step per id) from an empty context.
nibble::Result<double> TimeRun(nibble::Session& s, const std::vector<int32_t>& ids, bool prompt) {
  if (nibble::Status st = s.Truncate(0); !st.ok()) return st.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (prompt) {
    if (nibble::Status st = s.Prefill(ids); !st.ok()) return st.error();
  } else {
    for (const int32_t id : ids)
      if (nibble::Status st = s.Step(id); !st.ok()) return st.error();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A prefill sequence whose chunks join decode steps (mixed tg): `chunk` ids every `every` steps;
// it starts over from an empty context when the next chunk would not fit.
struct ChunkFeed {
  nibble::Session* session = nullptr;
  std::vector<int32_t> chunk;
  int64_t every = 1;
};

// Seconds for n_gen batched steps of the sessions from an empty context: step i feeds
// traces[s][i] to session s, plus the feed's chunk on every feed->every-th step when given.
nibble::Result<double> TimeBatch(const std::vector<nibble::Session*>& ss, const std::vector<std::vector<int32_t>>& traces,
                                 const ChunkFeed* feed = nullptr) {
  for (nibble::Session* s : ss)
    if (nibble::Status st = s->Truncate(0); !st.ok()) return st.error();
  if (feed != nullptr)
    if (nibble::Status st = feed->session->Truncate(0); !st.ok()) return st.error();
  std::vector<nibble::BatchItem> items(ss.size());
  for (size_t s = 0; s < ss.size(); ++s) items[s] = {ss[s], {0}};
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < traces[0].size(); ++i) {
    items.resize(ss.size());
    for (size_t s = 0; s < ss.size(); ++s) items[s].tokens[0] = traces[s][i];
    if (feed != nullptr && static_cast<int64_t>(i) % feed->every == 0) {
      nibble::Session& p = *feed->session;
      if (p.position() + static_cast<int64_t>(feed->chunk.size()) > p.capacity())
        if (nibble::Status st = p.Truncate(0); !st.ok()) return st.error();
      items.push_back({&p, feed->chunk});
    }
    if (nibble::Status st = nibble::StepBatch(items); !st.ok()) return st.error();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string HumanSize(int64_t bytes) {
  char b[32];
  if (bytes >= (int64_t{1} << 30)) std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(int64_t{1} << 30));
  else std::snprintf(b, sizeof b, "%.2f MiB", bytes / double(1 << 20));
  return b;
}

std::string HumanParams(int64_t n) {
  char b[32];
  if (n >= 1000000000) std::snprintf(b, sizeof b, "%.2f B", n / 1e9);
  else std::snprintf(b, sizeof b, "%.2f M", n / 1e6);
  return b;
}

// The markdown table of llama-bench, one row per test as it completes.
class TablePrinter {
 public:
  explicit TablePrinter(size_t name_width) : w_(std::max<size_t>(name_width, 5)) {}
  void Header() const {
    std::printf("| %-*s | %-14s | %10s | %9s | %-11s | %7s | %7s | %20s |\n", int(w_), "model", "format", "size", "params",
                "activations", "threads", "test", "t/s");
    std::printf("| %s | %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(w_, '-').c_str(), std::string(14, '-').c_str(),
                std::string(9, '-').c_str(), std::string(8, '-').c_str(), std::string(11, '-').c_str(),
                std::string(6, '-').c_str(), std::string(6, '-').c_str(), std::string(19, '-').c_str());
  }
  void Row(const TestResult& r) const {
    const Summary s = Summarise(r.tps);
    char tps[48];
    std::snprintf(tps, sizeof tps, "%.2f ± %.2f", s.median, s.sd);
    // "±" is two bytes in UTF-8 and one column wide: pad by one more.
    std::printf("| %-*s | %-14s | %10s | %9s | %-11s | %7d | %7s | %21s |\n", int(w_), r.model->name.c_str(),
                r.model->format.c_str(), HumanSize(r.model->size_bytes).c_str(), HumanParams(r.model->params).c_str(),
                r.activations.c_str(), r.threads, r.test.c_str(), tps);
    std::fflush(stdout);
  }

 private:
  size_t w_;
};

// The int4 kernel the activation mode runs (dense linears use oneDNN whatever the mode).
std::string KernelOf(const std::string& activations, const nibble::KernelDispatchReport& k) {
  // "auto:bf16" (auto as it resolved for the model) names its kernels like "bf16"
  const auto is = [&](const char* m) { return activations.size() >= 4 && activations.compare(activations.size() - 4, 4, m) == 0; };
  return is("int8") ? k.int8_kernel : is("bf16") ? k.bf16_act_kernel : k.chosen;
}

nlohmann::ordered_json ToJson(const TestResult& r, const nibble::KernelDispatchReport& k) {
  const Summary s = Summarise(r.tps);
  nlohmann::ordered_json j;
  j["model"] = r.model->name;
  j["model_dir"] = r.model->dir;
  j["model_type"] = r.model->model_type;
  j["format"] = r.model->format;
  j["model_size"] = r.model->size_bytes;
  j["model_n_params"] = r.model->params;
  j["activations"] = r.activations;
  j["n_threads"] = r.threads;
  j["kernels"] = KernelOf(r.activations, k);
  j["test"] = r.test;
  j["n_prompt"] = r.n_prompt;
  j["n_gen"] = r.n_gen;
  j["n_parallel"] = r.parallel;
  if (r.chunk > 0) {
    j["n_chunk"] = r.chunk;
    j["chunk_every"] = r.chunk_every;
    j["chunk_median_ts"] = Summarise(r.chunk_tps).median;
  }
  j["n_ctx"] = r.n_ctx;
  j["type_kv"] = r.kv_type;
  j["kv_bytes"] = r.kv_bytes;
  j["repetitions"] = r.tps.size();
  j["samples_ns"] = r.ns;
  j["samples_ts"] = r.tps;
  j["median_ts"] = s.median;
  j["stddev_ts"] = s.sd;
  j["mean_ts"] = s.mean;
  j["min_ts"] = s.min;
  j["max_ts"] = s.max;
  j["build_commit"] = BuildCommit();
  j["cpu_info"] = k.cpu_name;
  return j;
}

struct BenchRun {
  const BenchModelArgs& a;
  const TablePrinter& table;
  std::vector<TestResult>& results;
};

// The positions the longest test fills (every test starts from an empty context).
int64_t ContextNeeded(const BenchModelArgs& a) {
  int64_t ctx = 1;
  for (int64_t p : a.n_prompt) ctx = std::max(ctx, p);
  for (int64_t n : a.n_gen) ctx = std::max(ctx, n);
  return std::max(ctx, a.chunk);
}

// Prints the row of a finished test and keeps its result.
nibble::Status Report(TestResult r, const BenchRun& run, const nibble::Model& m) {
  r.n_ctx = run.a.kv.ctx_size > 0 ? run.a.kv.ctx_size : ContextNeeded(run.a);
  r.kv_type = nibble::KvDtypeName(m.info().kv_dtype);
  r.kv_bytes = nibble::KvCacheBytes(m, r.n_ctx) * (r.parallel + (r.chunk > 0 ? 1 : 0));
  if (!run.a.json) run.table.Row(r);
  run.results.push_back(std::move(r));
  return nibble::Status::Ok();
}

// One test (pp or tg) repeated: appends its result and prints the row.
nibble::Status RunTest(nibble::Session& s, TestResult r, int32_t bos, const BenchRun& run) {
  const bool prompt = r.n_prompt > 0;
  const int64_t count = prompt ? r.n_prompt : r.n_gen;
  const int64_t vocab = s.model().info().vocab_size;
  for (int rep = 0; rep < run.a.repetitions; ++rep) {
    auto sec = TimeRun(s, Trace(count, vocab, bos, rep), prompt);
    if (!sec.ok()) return sec.error();
    r.ns.push_back(*sec * 1e9);
    r.tps.push_back(count / *sec);
  }
  return Report(std::move(r), run, s.model());
}

// tg of r.parallel sequences stepped together (StepBatch), each with its own trace per repetition;
// with r.chunk, one more session's r.chunk-token prefill chunks join every r.chunk_every-th step.
nibble::Status RunBatchTest(const nibble::Model& m, const nibble::SessionOptions& so, TestResult r, int32_t bos,
                            const BenchRun& run) {
  std::vector<std::unique_ptr<nibble::Session>> owned;
  std::vector<nibble::Session*> ss;
  for (int64_t i = 0; i <= r.parallel; ++i) {  // the last one is the chunk feed's
    auto s = nibble::Session::Create(m, so);
    if (!s.ok()) return s.error();
    ss.push_back(s->get());
    owned.push_back(std::move(s).value());
  }
  const int64_t vocab = m.info().vocab_size;
  ChunkFeed feed{ss.back(), Trace(r.chunk, vocab, -1, 999), std::max<int64_t>(1, r.chunk_every)};
  ss.pop_back();
  const ChunkFeed* chunks = r.chunk > 0 ? &feed : nullptr;
  const auto traces = [&](int rep, int64_t n) {
    std::vector<std::vector<int32_t>> t;
    for (int64_t i = 0; i < r.parallel; ++i) t.push_back(Trace(n, vocab, bos, rep * 1000 + static_cast<int>(i)));
    return t;
  };
  if (auto w = TimeBatch(ss, traces(-1, 1), chunks); !w.ok()) return w.error();  // warmup
  const int64_t chunk_steps = chunks != nullptr ? (r.n_gen + feed.every - 1) / feed.every : 0;
  for (int rep = 0; rep < run.a.repetitions; ++rep) {
    auto sec = TimeBatch(ss, traces(rep, r.n_gen), chunks);
    if (!sec.ok()) return sec.error();
    r.ns.push_back(*sec * 1e9);
    r.tps.push_back(static_cast<double>(r.n_gen * r.parallel) / *sec);
    r.chunk_tps.push_back(static_cast<double>(chunk_steps * r.chunk) / *sec);
  }
  return Report(std::move(r), run, m);
}

// Every test on one loaded model and thread count, after an untimed warmup of each kind.
nibble::Status RunThreads(const nibble::Model& m, const ModelDesc& d, const std::string& act, int threads,
                          const BenchRun& run) {
  const int64_t vocab = m.info().vocab_size;
  nibble::SessionOptions so;
  so.context = run.a.kv.ctx_size > 0 ? run.a.kv.ctx_size : ContextNeeded(run.a);
  so.threads = threads;
  so.max_memory = run.a.kv.max_memory;
  auto session = nibble::Session::Create(m, so);
  if (!session.ok()) return session.error();
  auto bos_ids = m.Tokenize("");
  const int32_t bos = bos_ids.ok() && !bos_ids->empty() ? (*bos_ids)[0] : -1;
  nibble::Session& s = **session;
  for (int64_t p : run.a.n_prompt)
    if (p > 0) {
      if (auto w = TimeRun(s, Trace(p, vocab, bos, -1), true); !w.ok()) return w.error();
      break;
    }
  if (auto w = TimeRun(s, Trace(1, vocab, bos, -1), false); !w.ok()) return w.error();
  for (int64_t p : run.a.n_prompt)
    if (p > 0)
      if (auto st = RunTest(s, {&d, act, "pp" + std::to_string(p), threads, p, 0, 1, 0, 0, {}, {}, {}, 0, 0, ""}, bos, run); !st.ok()) return st;
  for (int64_t n : run.a.n_gen) {
    if (n <= 0) continue;
    for (int64_t par : run.a.parallel) {
      TestResult r{&d, act, "tg" + std::to_string(n), threads, 0, n, par, 0, 0, {}, {}, {}, 0, 0, ""};
      if (par > 1) r.test += " x" + std::to_string(par);
      if (auto st = par > 1 ? RunBatchTest(m, so, r, bos, run) : RunTest(s, r, bos, run); !st.ok()) return st;
      if (run.a.chunk == 0) continue;
      r.chunk = run.a.chunk;
      r.chunk_every = run.a.chunk_every;
      r.test += (par > 1 ? "" : " x1") + std::string(" +") + std::to_string(r.chunk) + "/" + std::to_string(r.chunk_every);
      if (auto st = RunBatchTest(m, so, r, bos, run); !st.ok()) return st;
    }
  }
  return nibble::Status::Ok();
}


// One model in every activation mode; a mode the model's int4 linears cannot run is skipped
// with a note. `ran` counts the modes that ran.
nibble::Status RunModel(const std::string& dir, const std::vector<int>& threads, const BenchRun& run,
                        std::vector<std::unique_ptr<ModelDesc>>& descs, int& ran) {
  for (const std::string& act : run.a.activations) {
    nibble::LoadOptions lo;
    nibble::ParseActivationType(act, &lo.activations);
    ApplyKvArgs(run.a.kv, &lo);
    auto m = nibble::Model::Load(dir, lo);
    if (!m.ok()) return m.error();
    const nibble::ModelInfo& info = (*m)->info();
    PrintWarnings(dir, info.warnings);
    if ((act == "int8" || act == "bf16") && info.activation_linears == 0) {
      std::fprintf(stderr, "bench-model: %s skipped for %s: %s\n", act.c_str(), dir.c_str(),
                   (act == "int8" ? Int8NotServed(dir) : Bf16NotServed(dir)).c_str());
      continue;
    }
    if (ContextNeeded(run.a) > info.max_position_embeddings)
      return nibble::MakeError("-p / -n ", ContextNeeded(run.a), " exceeds max_position_embeddings ",
                               info.max_position_embeddings, " of ", dir);
    const int64_t ctx = run.a.kv.ctx_size > 0 ? run.a.kv.ctx_size : ContextNeeded(run.a);  // >= it (RunBenchModel)
    if (ctx > info.max_position_embeddings)
      return nibble::MakeError("--ctx_size ", ctx, " exceeds max_position_embeddings ", info.max_position_embeddings, " of ", dir);
    int64_t sequences = 1;  // sessions alive at once: the pp/tg session and a tg x P batch (+ a chunk feed)
    for (int64_t p : run.a.parallel) sequences = std::max(sequences, 1 + (p > 1 || run.a.chunk > 0 ? p : 0) + (run.a.chunk > 0 ? 1 : 0));
    if (const std::string err = ReportKvMemory(**m, ctx, run.a.kv); !err.empty()) return nibble::MakeError(err);
    if (sequences > 1)
      std::fprintf(stderr, "KV cache: up to %lld sessions at once (--parallel): %.1f MiB\n", static_cast<long long>(sequences),
                   static_cast<double>(nibble::KvCacheBytes(**m, ctx) * sequences) / (1024.0 * 1024.0));
    if (descs.empty() || descs.back()->dir != dir) descs.push_back(std::make_unique<ModelDesc>(Describe(dir, info)));
    const std::string shown = act == "auto" ? "auto:" + std::string(nibble::ActivationTypeName(info.activations)) : act;
    for (int t : threads)
      if (nibble::Status st = RunThreads(**m, *descs.back(), shown, t, run); !st.ok()) return st;
    ++ran;
  }
  return nibble::Status::Ok();
}

int RunBenchModel(const BenchModelArgs& a) {
  if (a.repetitions < 1) return UsageError("-r " + std::to_string(a.repetitions) + " must be >= 1");
  for (int64_t v : a.n_prompt)
    if (v < 0) return UsageError("-p " + std::to_string(v) + " must be >= 0");
  for (int64_t v : a.n_gen)
    if (v < 0) return UsageError("-n " + std::to_string(v) + " must be >= 0");
  for (int64_t v : a.parallel)
    if (v < 1) return UsageError("--parallel " + std::to_string(v) + " must be >= 1");
  if (a.chunk < 0) return UsageError("--chunk " + std::to_string(a.chunk) + " must be >= 0");
  if (a.chunk_every < 1) return UsageError("--chunk_every " + std::to_string(a.chunk_every) + " must be >= 1");
  nibble::ActivationType unused;
  for (const std::string& s : a.activations)
    if (!nibble::ParseActivationType(s, &unused))
      return UsageError("--activations: unknown mode \"" + s + "\" (auto, fp32, bf16, int8)");
  if (a.kv.ctx_size > 0 && a.kv.ctx_size < ContextNeeded(a))
    return UsageError("--ctx_size " + std::to_string(a.kv.ctx_size) + " is smaller than the longest test (-p / -n / --chunk " +
                      std::to_string(ContextNeeded(a)) + ")");
  std::vector<int> threads;  // 0 resolved to the count it means, so the table shows it
  for (int t : a.threads) {
    if (t == 0) nibble::SetNumThreads(0);
    threads.push_back(t > 0 ? t : nibble::NumThreads());
  }
  size_t name_width = 0;
  for (const std::string& m : a.models)
    name_width = std::max(name_width, std::filesystem::path(m).lexically_normal().filename().string().size());
  const TablePrinter table(name_width);
  if (!a.json) table.Header();
  std::vector<TestResult> results;
  std::vector<std::unique_ptr<ModelDesc>> descs;
  const BenchRun run{a, table, results};
  int ran = 0;
  for (const std::string& dir : a.models)
    if (nibble::Status st = RunModel(dir, threads, run, descs, ran); !st.ok()) return Fail(st.error().message);
  if (ran == 0) return Fail("bench-model: no activation mode ran (see the notes above)");
  const nibble::KernelDispatchReport k = nibble::DescribeKernels();
  if (a.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const TestResult& r : results) j.push_back(ToJson(r, k));
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("\nt/s: median ± standard deviation over %d repetition%s | kernels: %s | build: %s | cpu: %s\n",
                a.repetitions, a.repetitions == 1 ? "" : "s", k.chosen.c_str(), BuildCommit().c_str(),
                k.cpu_name.empty() ? "unknown" : k.cpu_name.c_str());
  }
  return 0;
}
}  // namespace

Runner RegisterBenchModel(CLI::App& app) {
  auto a = std::make_shared<BenchModelArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench-model", "Prompt processing and token generation tokens/s of whole models (llama-bench's pp / tg)");
  cmd->add_option("--model,-m,--model_dir", a->models, "Model directories (several: one after another)")->required()->delimiter(',');
  cmd->add_option("-p,--n_prompt", a->n_prompt, "Prompt lengths for pp tests, comma-separated; 0 = none")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("-n,--n_gen", a->n_gen, "Generated tokens for tg tests, comma-separated; 0 = none")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--parallel,-P", a->parallel,
                  "Sequences decoded together in tg tests (batched decode, each weight read once per step), "
                  "comma-separated; t/s counts every sequence's tokens")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--chunk", a->chunk,
                  "Prefill chunk tokens: every tg test also runs mixed, its sequences' decode steps joined every "
                  "--chunk_every steps by a chunk of one more sequence's prefill (chunked prefill); 0 = no mixed tests")
      ->capture_default_str();
  cmd->add_option("--chunk_every", a->chunk_every, "Decode steps between two prefill chunks of --chunk")->capture_default_str();
  cmd->add_option("-r,--repetitions", a->repetitions, "Timed repetitions of each test")->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "Thread counts, comma-separated (0 = all cores)")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(0, nibble::kMaxThreads));
  cmd->add_option("--activations", a->activations, "Activation modes, comma-separated: auto (bf16 where served, else fp32), fp32, bf16, int8")
      ->delimiter(',')->capture_default_str();
  AddKvOptions(cmd, &a->kv, "default the longest test's -p / -n");
  cmd->add_flag("--json", a->json, "Print the results as a JSON array (with every repetition) instead of the table");
  return [a]() { return RunBenchModel(*a); };
}

}  // namespace nibble_cli
