// The CLI as a user runs it: goldens from the shipped models' READMEs, and clear errors with a
// non-zero exit code (never a signal) for bad input.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "support/load_env.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

using nibble_test::ParsePerplexity;
using nibble_test::Quote;
using nibble_test::ReadFile;
using nibble_test::RunNibble;
using nibble_test::RunResult;
using nibble_test::RunCommand;

TEST(Cli, Stories260KGreedyMatchesPublishedText) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  RunResult r = RunNibble("generate --model " + Quote(nibble_test::SharedModel("stories260K")) +
                        " --temperature 0 -n 255 --prompt ''",
                    /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, ReadFile(nibble_test::SharedModel("stories260K") + "/expected_greedy.txt"));
}

TEST(Cli, Stories260KWikiTextPerplexity40Windows) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/wikitext-2-raw-test.txt");
  RunResult r = RunNibble("perplexity --model " + Quote(nibble_test::SharedModel("stories260K")) + " --text " +
                    Quote(nibble_test::SharedData("wikitext-2-raw-test.txt")) + " --seq_len 512 --max_windows 40");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("scored tokens: 20440"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens: 815070"), std::string::npos) << r.out;
  const double ppl = ParsePerplexity(r.out);
  EXPECT_NEAR(ppl, 131.011, 131.011 * 0.002) << r.out;  // reference: stories260K/goldens/perplexity.json
}

TEST(Cli, EmbeddedModelProseValPerplexity60Windows) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  RunResult r = RunNibble("perplexity --model " + Quote(nibble_test::EmbeddedModel()) + " --text " +
                    Quote(nibble_test::SharedData("prose-val.txt")) + " --seq_len 512 --max_windows 60");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NEAR(ParsePerplexity(r.out), 62.672, 62.672 * 0.002) << r.out;  // prose-llama-7m README
}

TEST(Cli, GenerateStreamsAndReportsSpeed) {
  RunResult r = RunNibble("generate --model " + Quote(nibble_test::EmbeddedModel()) +
                    " --prompt 'And God said' -n 8 --temperature 0.7 --seed 3 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prefill: 4 tokens"), std::string::npos) << r.out;  // BOS + 3 pieces
}

// Each bench case's % column is its GB/s against the bandwidth column measured right before it,
// and the closing line gives the range of those measurements.
TEST(Cli, BenchPercentIsAgainstTheBandwidthMeasuredBeforeEachCase) {
  RunResult r = RunNibble(
      "bench --threads 1 --shapes 1024x512 --group_size 128 --m 1 4 --bandwidth_gib 0.02 --passes 2 "
      "--cycle_gib 0.02 --seconds 0.02");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::regex row(R"(1024x512 +128 +(\d+) +\S+ +\d+ +[0-9.]+ +[0-9.]+ +([0-9.]+) +([0-9.]+) +([0-9.]+) )");
  int rows = 0;
  double lo = 1e30, hi = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), row), end; it != end; ++it) {
    const double gbs = std::stod((*it)[2]), bw = std::stod((*it)[3]), pct = std::stod((*it)[4]);
    EXPECT_GT(bw, 0) << it->str();
    // Printed rounding: % to 0.05, GB/s to 0.005, bw to 0.05.
    EXPECT_NEAR(pct, 100.0 * gbs / bw, 0.05 + 0.5 / bw + 5.0 * gbs / (bw * bw) + 1e-9) << it->str();
    lo = std::min(lo, bw);
    hi = std::max(hi, bw);
    ++rows;
  }
  EXPECT_EQ(rows, 2) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(DRAM read bandwidth before the cases: ([0-9.]+) - ([0-9.]+) GB/s)")))
      << r.out;
  EXPECT_NEAR(std::stod(m[1]), lo, 0.051) << r.out;
  EXPECT_NEAR(std::stod(m[2]), hi, 0.051) << r.out;
#if defined(__x86_64__)
  // cyc/w: the best round's TSC ticks per call per weight of W (1 thread), i.e. ms/call times the
  // TSC frequency printed at the end, over N·K; the header says the TSC ticks at the nominal clock.
  EXPECT_NE(r.out.find("the TSC ticks\nat the CPU's nominal frequency"), std::string::npos) << r.out;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(TSC: ([0-9.]+) GHz)"))) << r.out;
  const double ghz = std::stod(m[1]);
  EXPECT_GT(ghz, 0.1) << r.out;
  const std::regex full(R"(1024x512 +128 +\d+ +\S+ +\d+ +[0-9.]+ +([0-9.]+) +(?:\S+ +){6}([0-9.]+)\n)");
  int cyc_rows = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), full), end; it != end; ++it) {
    const double ms = std::stod((*it)[1]), cyc = std::stod((*it)[2]);
    const double want = ms * 1e-3 * ghz * 1e9 / (1024.0 * 512.0);
    // Printed rounding: ms to 0.0005, cyc/w to 0.0005; the GHz is the mean over all rounds.
    EXPECT_NEAR(cyc, want, 0.0005 + 0.0005e-3 * ghz * 1e9 / (1024.0 * 512.0) + 0.02 * want) << it->str();
    ++cyc_rows;
  }
  EXPECT_EQ(cyc_rows, 2) << r.out;
#endif
}

// Without OMP_WAIT_POLICY / GOMP_SPINCOUNT in its environment the CLI runs with its own short
// spin count (support/load_env.h); either variable set by the user is kept as it is.
TEST(Cli, OpenMpSpinCountIsShortUnlessTheUserSetsOne) {
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "NIBBLE_DEFAULT_GOMP_SPINCOUNT"}) {
    if (const char* x = std::getenv(v)) saved.emplace_back(v, x);
    unsetenv(v);
  }
  const RunResult ours = RunNibble("inspect --kernels");
  setenv("GOMP_SPINCOUNT", "7", 1);
  const RunResult users = RunNibble("inspect --kernels");
  unsetenv("GOMP_SPINCOUNT");
  setenv("OMP_WAIT_POLICY", "active", 1);
  const RunResult policy = RunNibble("inspect --kernels");
  unsetenv("OMP_WAIT_POLICY");
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
  EXPECT_NE(ours.out.find(std::string("openmp wait: GOMP_SPINCOUNT=") + nibble_cli::kDefaultSpinCount +
                          " (nibble's default)\n"),
            std::string::npos)
      << ours.out;
  EXPECT_NE(users.out.find("openmp wait: GOMP_SPINCOUNT=7 (from the environment)\n"), std::string::npos) << users.out;
  EXPECT_NE(policy.out.find("openmp wait: OMP_WAIT_POLICY=active (from the environment)\n"), std::string::npos)
      << policy.out;
}

// OpenBLAS's kernels: where it takes the CPU for a "Prescott" (Debian's 0.3.21 on Sapphire and
// Emerald Rapids) the CLI asks for SkylakeX (AVX-512) or Haswell (AVX2 + FMA); any other choice
// of OpenBLAS's, and OPENBLAS_CORETYPE set by the user, are kept.
TEST(Cli, OpenBlasCoreReplacesPrescottUnlessTheUserSetsOne) {
  EXPECT_STREQ(nibble_cli::BlasCoreFor("Prescott", true, true), "SkylakeX");
  EXPECT_STREQ(nibble_cli::BlasCoreFor("prescott", false, true), "Haswell");
  EXPECT_EQ(nibble_cli::BlasCoreFor("Prescott", false, false), nullptr);
  EXPECT_EQ(nibble_cli::BlasCoreFor("Zen", true, true), nullptr);
  EXPECT_EQ(nibble_cli::BlasCoreFor("SkylakeX", true, true), nullptr);
  const char* const line = "openblas core (GPTQ's factorisations; OPENBLAS_CORETYPE): ";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set for the tests";
  // OpenBLAS's own choice, from the LAPACK the CLI loads (this binary does not link it).
  void* lapack = dlopen("liblapack.so.3", RTLD_NOW | RTLD_LOCAL);
  const auto core_name = lapack != nullptr ? reinterpret_cast<char* (*)()>(dlsym(lapack, "openblas_get_corename")) : nullptr;
  if (core_name == nullptr) GTEST_SKIP() << "LAPACK does not come from OpenBLAS here";
  const std::string here = core_name();
  const char* better = nibble_cli::BlasCoreFor(here, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"),
                                               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  const RunResult ours = RunNibble("inspect --kernels");
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  const RunResult users = RunNibble("inspect --kernels");
  unsetenv("OPENBLAS_CORETYPE");
  const std::string want = better != nullptr ? std::string(better) + " (nibble's default)" : here;
  EXPECT_NE(ours.out.find(line + want + "\n"), std::string::npos) << ours.out;
  EXPECT_NE(users.out.find(line + std::string("Haswell (from the environment)\n")), std::string::npos) << users.out;
}

// NIBBLE_ISA forces the vectorised row ops with the int4 kernels, and inspect --kernels says so.
TEST(Cli, NibbleIsaScalarForcesTheRowOps) {
  const char* prev = std::getenv("NIBBLE_ISA");
  const std::string saved = prev != nullptr ? prev : "";
  setenv("NIBBLE_ISA", "scalar", 1);
  RunResult r = RunNibble("inspect --kernels");
  if (prev != nullptr) {
    setenv("NIBBLE_ISA", saved.c_str(), 1);
  } else {
    unsetenv("NIBBLE_ISA");
  }
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("int4 kernels: scalar\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("row ops (softmax, SiLU, AWQ loss): scalar\n"), std::string::npos) << r.out;
  RunResult j = RunNibble("inspect --kernels --json");
  ASSERT_EQ(j.exit_code, 0) << j.out;
  EXPECT_NE(j.out.find("\"vec_ops\": \""), std::string::npos) << j.out;
}

// NIBBLE_PREFETCH forces the decode loops' prefetch hint; a bad value is named on stderr and the
// automatic choice kept.
TEST(Cli, NibblePrefetchForcesTheDecodeHint) {
  const char* prev = std::getenv("NIBBLE_PREFETCH");
  const std::string saved = prev != nullptr ? prev : "";
  setenv("NIBBLE_PREFETCH", "nta", 1);
  const RunResult nta = RunNibble("inspect --kernels");
  setenv("NIBBLE_PREFETCH", "t3", 1);
  const RunResult bad = RunNibble("inspect --kernels --json");
  if (prev != nullptr) {
    setenv("NIBBLE_PREFETCH", saved.c_str(), 1);
  } else {
    unsetenv("NIBBLE_PREFETCH");
  }
  ASSERT_EQ(nta.exit_code, 0) << nta.out;
  EXPECT_NE(nta.out.find("decode prefetch (NIBBLE_PREFETCH=nta|t0): nta (forced by NIBBLE_PREFETCH=nta)\n"),
            std::string::npos)
      << nta.out;
  ASSERT_EQ(bad.exit_code, 0) << bad.out;
  EXPECT_NE(bad.out.find("nibble: NIBBLE_PREFETCH=t3: unknown prefetch hint \"t3\" (expected nta or t0)"),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("\"decode_prefetch_message\": "), std::string::npos) << bad.out;
}

TEST(Cli, SameSeedSameText) {
  const std::string args = "generate --model " + Quote(nibble_test::EmbeddedModel()) +
                           " --prompt 'The list' -n 12 --temperature 1.0 --top_k 20 --top_p 0.9 --seed 7";
  RunResult a = RunNibble(args, false), b = RunNibble(args, false);
  ASSERT_EQ(a.exit_code, 0);
  EXPECT_EQ(a.out, b.out);
}

// Without --seed a random seed is drawn and printed; given back with --seed it repeats the text.
TEST(Cli, DefaultSeedIsPrintedAndRepeatsTheText) {
  const std::string args = "generate --model " + Quote(nibble_test::EmbeddedModel()) +
                           " --prompt 'The list' -n 12 --temperature 1.0 --threads 1";
  RunResult a = RunNibble(args), b = RunNibble(args);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  std::smatch ma, mb;
  ASSERT_TRUE(std::regex_search(a.out, ma, std::regex(R"(seed: (\d+)\n)"))) << a.out;
  ASSERT_TRUE(std::regex_search(b.out, mb, std::regex(R"(seed: (\d+)\n)"))) << b.out;
  EXPECT_NE(ma[1].str(), mb[1].str()) << "two runs drew the same seed";
  RunResult again = RunNibble(args + " --seed " + ma[1].str(), false);
  ASSERT_EQ(again.exit_code, 0);
  ASSERT_GT(again.out.size(), std::string("The list\n").size());
  EXPECT_NE(a.out.find(again.out), std::string::npos) << "first run:\n" << a.out << "\nwith its seed:\n" << again.out;
}

TEST(Cli, PromptFromFileMatchesThePromptFlag) {
  const std::string path = "/tmp/nibble-cli-prompt-" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << "And God said\n";  // one trailing newline is dropped, as llama.cpp's -f does
  const std::string model = "generate --model " + Quote(nibble_test::EmbeddedModel()) + " -n 8 --temperature 0";
  RunResult f = RunNibble(model + " -f " + path, false), p = RunNibble(model + " --prompt 'And God said'", false);
  std::remove(path.c_str());
  ASSERT_EQ(f.exit_code, 0);
  EXPECT_EQ(f.out, p.out);
  EXPECT_EQ(f.out.rfind("And God said", 0), 0u) << f.out;
}

// The text up to a stop string is printed, the stop string and what follows are not.
TEST(Cli, StopStringEndsGenerationBeforeIt) {
  const std::string args = "generate --model " + Quote(nibble_test::EmbeddedModel()) +
                           " --prompt 'And God said' -n 24 --temperature 0 --threads 1";
  RunResult full = RunNibble(args, false);
  ASSERT_EQ(full.exit_code, 0);
  const size_t prompt = std::string("And God said").size();
  ASSERT_GT(full.out.size(), prompt + 12) << full.out;
  const std::string stop = full.out.substr(prompt + 6, 4);
  const size_t at = full.out.find(stop, prompt);
  RunResult r = RunNibble(args + " --stop " + Quote(stop) + " --stop 'never in this text'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // stdout ends with the text before the stop and a newline; stderr's summary follows.
  EXPECT_NE(r.out.find(full.out.substr(0, at) + "\n\nprefill: "), std::string::npos) << "stop " << Quote(stop) << "\n" << r.out;
  EXPECT_NE(r.out.find("stop: stop string \"" + stop + "\""), std::string::npos) << r.out;
}

TEST(Cli, MaxNewTokensBeyondTheContextIsWarnedUpFront) {
  RunResult r = RunNibble("generate --model " + Quote(nibble_test::EmbeddedModel()) +
                          " --prompt 'And God said' -n 100000 --temperature 0 --stop ' '");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t warn = r.out.find("warning: -n 100000 exceeds the context: the prompt takes 4 of 512 positions");
  EXPECT_NE(warn, std::string::npos) << r.out;
  EXPECT_LT(warn, r.out.find("And God said")) << r.out;
  EXPECT_NE(r.out.find("at most 509 tokens"), std::string::npos) << r.out;
}

// --ctx_size bounds the context (and the warning); the KV bytes are printed before the run; a KV
// cache beyond --max_memory is refused with the numbers before anything runs; bad values are named.
TEST(Cli, CtxSizeKvDtypeAndMaxMemory) {
  const std::string gen = "generate --model " + Quote(nibble_test::EmbeddedModel()) + " --prompt 'And God said' --temperature 0";
  RunResult r = RunNibble(gen + " -n 40 --ctx_size 16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("the prompt takes 4 of 16 positions (--ctx_size), so at most 13 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV cache: ctx 16 x "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(bf16)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stop: context_full"), std::string::npos) << r.out;
  RunResult fp = RunNibble(gen + " -n 4 --kv_dtype fp32 --ctx_size 256");
  ASSERT_EQ(fp.exit_code, 0) << fp.out;
  EXPECT_NE(fp.out.find("(fp32)"), std::string::npos) << fp.out;
  RunResult big = RunNibble(gen + " -n 4 --ctx_size 512 --max_memory 1MiB");
  EXPECT_NE(big.exit_code, 0) << big.out;
  EXPECT_NE(big.out.find("1048576 bytes"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("a KV cache of 512 positions"), std::string::npos) << big.out;
  EXPECT_EQ(big.out.find("And God said"), std::string::npos) << "refused before generating:\n" << big.out;
  RunResult dtype = RunNibble(gen + " --kv_dtype fp8");
  EXPECT_NE(dtype.exit_code, 0);
  EXPECT_NE(dtype.out.find("--kv_dtype"), std::string::npos) << dtype.out;
  RunResult mem = RunNibble(gen + " --max_memory 12XB");
  EXPECT_NE(mem.exit_code, 0);
  EXPECT_NE(mem.out.find("\"12XB\""), std::string::npos) << mem.out;
  RunResult cache = RunNibble(gen + " --weight_cache ''");
  EXPECT_NE(cache.exit_code, 0);
  EXPECT_NE(cache.out.find("--weight_cache: expected a directory or off, got an empty string"), std::string::npos) << cache.out;
  RunResult ppl = RunNibble("perplexity --model " + Quote(nibble_test::EmbeddedModel()) + " --text " +
                            Quote(nibble_test::EmbeddedModel() + "/README.md") + " --seq_len 64 --ctx_size 32");
  EXPECT_NE(ppl.exit_code, 0);
  EXPECT_NE(ppl.out.find("--ctx_size 32 is smaller than the window (--seq_len 64)"), std::string::npos) << ppl.out;
}

TEST(Cli, VersionNamesTheCommitAndKernels) {
  RunResult r = RunNibble("--version");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(^nibble \d+\.\d+\.\d+ \(commit ([0-9a-f]{4,}|unknown)\)\n)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(kernels compiled in: .*scalar)"))) << r.out;
  EXPECT_NE(r.out.find("kernels chosen: int4 "), std::string::npos) << r.out;
}

// bench-model's table (one row per model, mode, thread count and test) and its JSON; a mode the
// dense model cannot run is a note, not a failure.
TEST(Cli, BenchModelTableAndJson) {
  const std::string args = "bench-model -m " + Quote(nibble_test::EmbeddedModel()) + " -p 8 -n 4 -r 2 -t 1,2";
  RunResult t = RunNibble(args + " --activations fp32,int8");
  ASSERT_EQ(t.exit_code, 0) << t.out;
  const std::regex row(R"(\| prose-llama-7m +\| dense \w+ +\| +[0-9.]+ MiB \| +[0-9.]+ M \| fp32 +\| +(\d) \| +(pp8|tg4) \| +([0-9.]+) ± ([0-9.]+) \|)");
  std::vector<std::string> seen;
  for (std::sregex_iterator it(t.out.begin(), t.out.end(), row), end; it != end; ++it) {
    seen.push_back((*it)[1].str() + " " + (*it)[2].str());
    EXPECT_GT(std::stod((*it)[3]), 0) << it->str();
    EXPECT_GE(std::stod((*it)[4]), 0) << it->str();
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"1 pp8", "1 tg4", "2 pp8", "2 tg4"})) << t.out;
  EXPECT_NE(t.out.find("bench-model: int8 skipped for"), std::string::npos) << t.out;
  RunResult j = RunNibble(args + " --json", false);
  ASSERT_EQ(j.exit_code, 0) << j.out;
  const nlohmann::json rows = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << j.out;
  ASSERT_EQ(rows.size(), 4u) << j.out;
  for (const auto& r : rows) {
    EXPECT_EQ(r.at("model"), "prose-llama-7m");
    EXPECT_GT(r.at("model_size").get<int64_t>(), 0);
    EXPECT_GT(r.at("model_n_params").get<int64_t>(), 0);
    EXPECT_EQ(r.at("activations"), "auto:fp32");  // the default, as it resolved for a dense model
    EXPECT_EQ(r.at("repetitions"), 2);
    EXPECT_EQ(r.at("samples_ts").size(), 2u);
    EXPECT_GT(r.at("median_ts").get<double>(), 0);
    EXPECT_GE(r.at("stddev_ts").get<double>(), 0);
    const bool pp = r.at("test") == "pp8";
    EXPECT_TRUE(pp || r.at("test") == "tg4") << r.dump();
    EXPECT_EQ(r.at("n_prompt"), pp ? 8 : 0);
    EXPECT_EQ(r.at("n_gen"), pp ? 0 : 4);
  }
  EXPECT_EQ(rows[0].at("n_threads"), 1);
  EXPECT_EQ(rows[3].at("n_threads"), 2);
}

// --chunk: each tg test also runs mixed, a prefill chunk joining the decode steps (x1 too);
// t/s counts decode tokens, the JSON adds the chunks' rate and the CPU.
TEST(Cli, BenchModelMixedChunkedPrefillRows) {
  const std::string args = "bench-model -m " + Quote(nibble_test::EmbeddedModel()) +
                           " -p 0 -n 4 -r 1 -t 1 --parallel 1,2 --chunk 8 --chunk_every 2 --ctx_size 32";
  RunResult t = RunNibble(args);
  ASSERT_EQ(t.exit_code, 0) << t.out;
  for (const char* test : {"tg4", "tg4 x1 +8/2", "tg4 x2", "tg4 x2 +8/2"})
    EXPECT_NE(t.out.find(std::string(" ") + test + " |"), std::string::npos) << test << "\n" << t.out;
  EXPECT_NE(t.out.find("| cpu: "), std::string::npos) << t.out;
  RunResult j = RunNibble(args + " --json", false);
  ASSERT_EQ(j.exit_code, 0) << j.out;
  const nlohmann::json rows = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(rows.is_array() && rows.size() == 4u) << j.out;
  const nlohmann::json& mixed = rows[3];
  EXPECT_EQ(mixed.at("test"), "tg4 x2 +8/2");
  EXPECT_EQ(mixed.at("n_chunk"), 8);
  EXPECT_EQ(mixed.at("chunk_every"), 2);
  EXPECT_GT(mixed.at("chunk_median_ts").get<double>(), 0);
  EXPECT_GT(mixed.at("median_ts").get<double>(), 0);
  // Three sessions of 32 positions (two decoding, one prefilling) against two.
  EXPECT_EQ(mixed.at("kv_bytes").get<int64_t>(), rows[2].at("kv_bytes").get<int64_t>() * 3 / 2);
  EXPECT_FALSE(rows[2].contains("n_chunk"));
  EXPECT_TRUE(mixed.at("cpu_info").is_string());
}

struct BadCase {
  const char* name;
  std::string args;
  std::string expect;  // substring of the error
};

TEST(Cli, BadInputGivesNamedErrorAndExitCode) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  const std::string model = Quote(nibble_test::EmbeddedModel());
  const std::string long_prompt(6000, 'x');
  const BadCase cases[] = {
      {"missing dir", "generate --model /nonexistent/dir -n 1", "/nonexistent/dir"},
      {"missing text", "perplexity --model " + model + " --text /nonexistent.txt", "/nonexistent.txt"},
      {"prompt too long", "generate --model " + model + " --prompt " + long_prompt + " -n 1", "max_position_embeddings"},
      {"seq_len too long", "perplexity --model " + model + " --text " + Quote(nibble_test::SharedData("prose-val.txt")) + " --seq_len 4096",
       "max_position_embeddings"},
      {"bad top_p", "generate --model " + model + " --top_p 0 -n 1", "--top_p"},
      {"bad min_p", "generate --model " + model + " --min_p 1.5 -n 1", "--min_p"},
      {"bad repeat_penalty", "generate --model " + model + " --repeat_penalty 0 -n 1", "--repeat_penalty"},
      {"missing prompt file", "generate --model " + model + " -f /nonexistent/prompt.txt -n 1", "/nonexistent/prompt.txt"},
      {"empty stop string", "generate --model " + model + " --stop '' -n 1", "--stop"},
      {"bench-model unknown activations", "bench-model -m " + model + " --activations fp8", "unknown mode \"fp8\""},
      {"generate unknown activations", "generate --model " + model + " --activations fp16 -n 1",
       "expected auto, fp32, bf16 or int8, got \"fp16\""},
      {"bench-model context", "bench-model -m " + model + " -p 4096 -n 0", "max_position_embeddings"},
      {"unknown flag", "generate --model " + model + " --frobnicate 3", "frobnicate"},
      {"unknown command", "bogus --model " + model, "unknown command \"bogus\""},
      // CLI11 would report the required flag as missing; the misspelt one is named instead.
      {"misspelt required flag", "perplexity --model-dir " + model + " --text x", "unknown option --model-dir (did you mean --model_dir?)"},
      {"misspelt required flag, close", "quantize --model-dir " + model + " --output_dir /tmp/nibble-unused-out",
       "unknown option --model-dir (did you mean --model_dir?)"},
      {"misspelt optional flag", "perplexity --model " + model + " --text x --seqlen 128",
       "unknown option --seqlen (did you mean --seq_len?)"},
      {"misspelt switch", "generate --model " + model + " --int8_activation -n 1",
       "unknown option --int8_activation (did you mean --int8_activations?)"},
      {"dash for underscore", "quantize --model_dir " + model + " --output_dir /tmp/nibble-unused-out --group-size 32",
       "unknown option --group-size (did you mean --group_size?)"},
      {"empty output dir", "quantize --model_dir " + model + " --output_dir ''", "--output_dir is empty"},
      {"overwrite a regular file", "quantize --model_dir " + model + " --output_dir " +
           Quote(nibble_test::SourceDir() + "/README.md") + " --overwrite", "is not a directory"},
      {"text is a directory", "perplexity --model " + model + " --text /tmp", "is a directory"},
      {"group_size with per_channel", "quantize --model_dir " + model + " --output_dir /tmp/nibble-unused-out"
           " --quant_scheme w_int4_per_channel_sym --group_size 32", "--group_size does not apply"},
      {"negative threads", "generate --model " + model + " --threads -2 -n 1", "--threads"},
      {"synth without a tokenizer", "synth --config " + Quote(nibble_test::SourceDir() + "/bench/configs/tinyllama-1.1b.json") +
           " --out /tmp/nibble-unused-synth --tokenizer_dir /nonexistent", "/nonexistent: no tokenizer.model"},
      {"synth group size that divides no linear", "synth --config " + Quote(nibble_test::SourceDir() + "/bench/configs/llama2-7b.json") +
           " --out /tmp/nibble-unused-synth --group_size 100",
       "--group_size 100 does not divide model.layers.0.self_attn.q_proj.weight (in_features 4096) of " +
           nibble_test::SourceDir() + "/bench/configs/llama2-7b.json; group sizes that divide every linear's in_features: "
           "1, 2, 4, 8, 16, 32, 64, 128, 256"},
      {"int8 activations on a dense model", "generate --model " + model + " --int8_activations -n 1", "no int4 linear"},
      {"bf16 activations on a dense model", "generate --model " + model + " --bf16_activations -n 1", "no int4 linear"},
      {"bench bf16 activations at a group size they cannot serve",
       "bench --bf16_activations --group_size 48 --no_bandwidth --shapes 4800x1024", "group_size 48 is not a multiple of 32"},
      {"int8 and bf16 activations together", "perplexity --model " + model + " --text x --int8_activations --bf16_activations",
       "excludes"},
      {"report into a missing directory", "quantize --model_dir " + model + " --output_dir /tmp/nibble-unused-out"
           " --report /nonexistent/dir/r.json", "directory /nonexistent/dir does not exist"},
      {"misspelt --quant_config key", "quantize --model_dir " + model + " --output_dir /tmp/nibble-unused-out --quant_config " +
           Quote(nibble_test::SourceDir() + "/tests/e2e/data/misspelt_quant_config.json"),
       "exlcude: unknown key (did you mean \"exclude\"?)"},
      {"report path is a directory", "quantize --model_dir " + model + " --output_dir /tmp/nibble-unused-out --report /tmp",
       "--report /tmp is a directory"},
  };
  for (const auto& c : cases) {
    RunResult r = RunNibble(c.args);
    EXPECT_GT(r.exit_code, 0) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.name << ": " << r.out;
  }
}

TEST(Cli, InvalidUtf8PromptIsRefused) {
  // popen runs sh: the invalid byte comes from printf.
  RunResult r = RunNibble("generate --model " + Quote(nibble_test::EmbeddedModel()) + " --prompt \"$(printf 'ab\\377')\" -n 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not valid UTF-8"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST(Cli, UnusedLayerOverrideIsWarnedAbout) {
  const std::string out = "/tmp/nibble-cli-warn-" + std::to_string(getpid());
  RunResult r = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out +
                          " --layer_quant_config 'nomatch.*:group_size=32' --exclude_layers lm_head lm_haed --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("pattern \"nomatch.*\" matched no layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("warning: exclude entry \"lm_haed\" matched no layer"), std::string::npos) << r.out;
  ASSERT_NE(r.out.find("plan: "), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("matched no layer"), r.out.find("plan: ")) << "warned after the run began:\n" << r.out;
  std::system(("rm -rf " + out).c_str());
}

// `compare --methods`: each method quantized into --keep DIR, then one table with the quantization
// time; the JSON names the method of each row.
TEST(Cli, CompareMethodsQuantizesEachAndPrintsOneTable) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/prose-calib.txt", "data/prose-val.txt");
  const std::string dir = "/tmp/nibble-cli-methods-" + std::to_string(getpid());
  std::system(("rm -rf " + dir).c_str());
  RunResult r = RunNibble("compare --model " + Quote(nibble_test::SharedModel("stories260K")) +
                          " --methods rtn,gptq --dataset " + Quote(nibble_test::SharedData("prose-calib.txt")) +
                          " --group_size 32 --misaligned per_channel --num_calib_data 4 --calib_seq_len 64 --text " +
                          Quote(nibble_test::SharedData("prose-val.txt")) + " --seq_len 128 --max_windows 2 --keep " + dir +
                          " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("quantize s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compare: quantizing with gptq (2 of 2)"), std::string::npos) << r.out;
  const size_t brace = r.out.find("\n{");
  ASSERT_NE(brace, std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(brace + 1, r.out.rfind('}') - brace));
  ASSERT_EQ(j["models"].size(), 2u);
  EXPECT_EQ(j["models"][0]["method"], "rtn");
  EXPECT_EQ(j["models"][1]["method"], "gptq");
  EXPECT_GE(j["models"][1]["quantize_seconds"].get<double>(), 0.0);
  EXPECT_TRUE(std::ifstream(dir + "/gptq/config.json").good());
  RunResult bad = RunNibble("compare --model " + Quote(nibble_test::SharedModel("stories260K")) + " --methods rtn,gptx --text " +
                            Quote(nibble_test::SharedData("prose-val.txt")));
  EXPECT_GT(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("\"gptx\" is not a method"), std::string::npos) << bad.out;
  std::system(("rm -rf " + dir).c_str());
}

// What other engines would read: quantize warns in one line per engine and reason with the flag
// that avoids it, `inspect --engines` shows the table and TP readiness, --tp refuses up front.
TEST(Cli, EnginesReportAndTpRefusal) {
  const std::string out = "/tmp/nibble-cli-engines-" + std::to_string(getpid());
  RunResult q = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out +
                          " --layer_quant_config 'model.layers.0.self_attn.q_proj:group_size=32' --overwrite");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  EXPECT_NE(q.out.find("warning: onnxruntime-genai misreads 1 linear"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("warning: vllm misreads 3 linears"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("avoid: give q/k/v_proj"), std::string::npos) << q.out;
  RunResult e = RunNibble("inspect " + out + " --engines");
  ASSERT_EQ(e.exit_code, 0) << e.out;
  EXPECT_NE(e.out.find("onnxruntime-genai"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("disagreement: vllm misreads"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("tensor parallel 2: ok"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("tensor parallel 4: fails: model.layers.0.self_attn.o_proj"), std::string::npos) << e.out;
  RunResult j = RunNibble("inspect " + out + " --engines --json", false);
  ASSERT_EQ(j.exit_code, 0) << j.out;
  EXPECT_NE(j.out.find("\"tensor_parallel\""), std::string::npos) << j.out;
  RunResult t = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out +
                          " --tp 8 --overwrite");
  EXPECT_EQ(t.exit_code, 2) << t.out;  // a flag's value the model cannot take: a usage error
  EXPECT_NE(t.out.find("--tp 8: model.layers.0.self_attn.o_proj"), std::string::npos) << t.out;
  std::system(("rm -rf " + out).c_str());
}

// quantize --report and report --plot as a user runs them: the JSON and the PNG are written whole
// (atomically), an unwritable plot path is a named error and leaves no file behind.
TEST(Cli, AwqReportAndPlotAreWrittenWhole) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/prose-calib.txt");
  const std::string dir = "/tmp/nibble-cli-report-" + std::to_string(getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  RunResult q = RunNibble("quantize --model_dir " + Quote(nibble_test::SharedModel("stories260K")) + " --output_dir " + dir +
                          "/q --quant_algo awq --dataset " + Quote(nibble_test::SharedData("prose-calib.txt")) +
                          " --group_size 32 --misaligned per_channel --num_calib_data 4 --seq_len 64 --report " + dir + "/r.json");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  const std::string rep = ReadFile(dir + "/r.json");
  ASSERT_FALSE(rep.empty());
  EXPECT_EQ(rep.front(), '{');
  EXPECT_EQ(rep.find_last_not_of(" \n"), rep.rfind('}'));
#ifndef NIBBLE_HAVE_CAIRO
  // A build without cairo refuses the plot, saying why, and writes nothing.
  RunResult off = RunNibble("report " + dir + "/r.json --plot " + dir + "/plot.png");
  EXPECT_GT(off.exit_code, 0) << off.out;
  EXPECT_NE(off.out.find("built without cairo: PNG plots are unavailable"), std::string::npos) << off.out;
  EXPECT_FALSE(std::ifstream(dir + "/plot.png").good());
  std::system(("rm -rf " + dir).c_str());
  GTEST_SKIP() << "built without cairo: the PNG checks need it";
#endif
  RunResult p = RunNibble("report " + dir + "/r.json --plot " + dir + "/plot.png");
  ASSERT_EQ(p.exit_code, 0) << p.out;
  const std::string png = ReadFile(dir + "/plot.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // A GPTQ report beside it: both summarised, one plot with RTN, AWQ and GPTQ.
  RunResult g = RunNibble("quantize --model_dir " + Quote(nibble_test::SharedModel("stories260K")) + " --output_dir " + dir +
                          "/g --quant_algo gptq --dataset " + Quote(nibble_test::SharedData("prose-calib.txt")) +
                          " --group_size 32 --misaligned per_channel --num_calib_data 4 --seq_len 64 --report " + dir + "/r2.json");
  ASSERT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("output error RTN->GPTQ:"), std::string::npos) << g.out;
  RunResult both = RunNibble("report " + dir + "/r.json " + dir + "/r2.json --plot " + dir + "/plot.png");
  ASSERT_EQ(both.exit_code, 0) << both.out;
  EXPECT_NE(both.out.find("output error RTN -> AWQ:"), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("output error RTN -> GPTQ:"), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("GPTQ damping 0.01 block 128 scales up_front act-order none"), std::string::npos) << both.out;
  EXPECT_GT(ReadFile(dir + "/plot.png").size(), png.size() / 2);
  std::system(("rm -rf " + dir + "/g " + dir + "/r2.json").c_str());
  RunResult bad = RunNibble("report " + dir + "/r.json --plot " + dir + "/missing/plot.png");
  EXPECT_GT(bad.exit_code, 0) << bad.out;
  EXPECT_NE(bad.out.find(dir + "/missing/plot.png"), std::string::npos) << bad.out;
  // Only what was asked for is there: no temporary files beside the report or the plot.
  std::system(("ls -A " + dir + " > " + dir + ".ls").c_str());
  const std::string listing = ReadFile(dir + ".ls");
  EXPECT_EQ(listing, "plot.png\nq\nr.json\n");
  std::system(("rm -rf " + dir + " " + dir + ".ls").c_str());
}

TEST(Cli, PerplexityDefaultSeqLenFitsTheModel) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  // Default seq_len = min(2048, max_position_embeddings) = 512 for the embedded model.
  RunResult r = RunNibble("perplexity --model " + Quote(nibble_test::EmbeddedModel()) + " --text " +
                          Quote(nibble_test::SharedData("prose-val.txt")) + " --max_windows 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("windows of 512 tokens"), std::string::npos) << r.out;
}

// The opt-in W4A8 path end to end: perplexity prints W4A16 and W4A8 on the same windows, and on
// the embedded model (no activation outliers) int8 activations cost well under 1 % perplexity
// (measured +0.03 % at 20 windows); generate runs with it.
TEST(Cli, Int8ActivationsPerplexityCostIsPrintedAndSmall) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  const std::string out = "/tmp/nibble-cli-w4a8-" + std::to_string(getpid());
  RunResult q = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out + " --overwrite");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  RunResult r = RunNibble("perplexity --model " + out + " --text " + Quote(nibble_test::SharedData("prose-val.txt")) +
                          " --seq_len 512 --max_windows 3 --int8_activations");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  double w4a16 = 0, w4a8 = 0;
  const size_t p16 = r.out.find("\nperplexity: ");
  const size_t p8 = r.out.find("int8 activations (W4A8, 42 int4 linears): mean NLL ");
  ASSERT_NE(p16, std::string::npos) << r.out;
  ASSERT_NE(p8, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + p16, "\nperplexity: %lf", &w4a16), 1) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + r.out.find("perplexity ", p8), "perplexity %lf", &w4a8), 1) << r.out;
  EXPECT_GT(w4a16, 10.0);
  EXPECT_NE(w4a8, w4a16);  // a different path ran
  EXPECT_LT(std::fabs(w4a8 / w4a16 - 1.0), 0.01) << r.out;
  // With --kl_divergence_base both runs share one pass of the base model; same perplexities.
  RunResult k = RunNibble("perplexity --model " + out + " --text " + Quote(nibble_test::SharedData("prose-val.txt")) +
                          " --seq_len 512 --max_windows 3 --int8_activations --kl_divergence_base " +
                          Quote(nibble_test::EmbeddedModel()));
  ASSERT_EQ(k.exit_code, 0) << k.out;
  char want16[64], want8[96];
  std::snprintf(want16, sizeof(want16), "\nperplexity: %.4f (base ", w4a16);
  std::snprintf(want8, sizeof(want8), "int8 activations (W4A8, 42 int4 linears): perplexity %.4f (", w4a8);
  EXPECT_NE(k.out.find(want16), std::string::npos) << want16 << "\n" << k.out;
  EXPECT_NE(k.out.find(want8), std::string::npos) << want8 << "\n" << k.out;
  EXPECT_NE(k.out.find("mean KLD"), std::string::npos) << k.out;
  RunResult g = RunNibble("generate --model " + out + " -n 4 --temperature 0 --int8_activations");
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("activations: int8 (W4A8) in 42 int4 linears"), std::string::npos) << g.out;
  // A model the int8 path cannot serve is refused before anything is evaluated.
  RunResult d = RunNibble("perplexity --model " + Quote(nibble_test::EmbeddedModel()) + " --text " +
                          Quote(nibble_test::SharedData("prose-val.txt")) + " --max_windows 1 --int8_activations");
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_NE(d.out.find("no int4 linear"), std::string::npos) << d.out;
  EXPECT_EQ(d.out.find("perplexity:"), std::string::npos) << d.out;
  std::system(("rm -rf " + out).c_str());
}

// The opt-in bf16-activation path end to end: perplexity prints fp32 and bf16 activations on the
// same windows, and rounding the activations to bf16 costs well under 1 % perplexity on the
// embedded model (measured −0.01 % at 3 windows; at 60 windows +0.001 %, mean KLD from FP
// +0.000002 nats); generate runs with it (the AVX-512 BF16 kernel
// where the CPU has one, else the W4A32 kernels on rounded inputs).
TEST(Cli, Bf16ActivationsPerplexityCostIsPrintedAndSmall) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  const std::string out = "/tmp/nibble-cli-bf16-" + std::to_string(getpid());
  RunResult q = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out + " --overwrite");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  RunResult r = RunNibble("perplexity --model " + out + " --text " + Quote(nibble_test::SharedData("prose-val.txt")) +
                          " --seq_len 512 --max_windows 3 --bf16_activations");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  double fp32 = 0, bf16 = 0;
  const size_t p32 = r.out.find("\nperplexity: ");
  const size_t pb = r.out.find("bf16 activations (W4A16 bf16, 42 int4 linears): mean NLL ");
  ASSERT_NE(p32, std::string::npos) << r.out;
  ASSERT_NE(pb, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + p32, "\nperplexity: %lf", &fp32), 1) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + r.out.find("perplexity ", pb), "perplexity %lf", &bf16), 1) << r.out;
  EXPECT_GT(fp32, 10.0);
  EXPECT_NE(bf16, fp32);  // a different path ran
  EXPECT_LT(std::fabs(bf16 / fp32 - 1.0), 0.01) << r.out;
  RunResult k = RunNibble("perplexity --model " + out + " --text " + Quote(nibble_test::SharedData("prose-val.txt")) +
                          " --seq_len 512 --max_windows 3 --bf16_activations --kl_divergence_base " +
                          Quote(nibble_test::EmbeddedModel()));
  ASSERT_EQ(k.exit_code, 0) << k.out;
  char want[96];
  std::snprintf(want, sizeof(want), "bf16 activations (W4A16 bf16, 42 int4 linears): perplexity %.4f (", bf16);
  EXPECT_NE(k.out.find(want), std::string::npos) << want << "\n" << k.out;
  RunResult g = RunNibble("generate --model " + out + " -n 4 --temperature 0 --bf16_activations");
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("activations: bf16 (W4A16) in 42 int4 linears ("), std::string::npos) << g.out;
  // The default is auto: bf16 where served (the same text as --bf16_activations), fp32 on request,
  // fp32 on a dense model; each run says which path ran.
  RunResult ga = RunNibble("generate --model " + out + " -n 4 --temperature 0");
  EXPECT_EQ(ga.exit_code, 0) << ga.out;
  EXPECT_NE(ga.out.find("activations: bf16 (auto) (W4A16) in 42 int4 linears ("), std::string::npos) << ga.out;
  EXPECT_EQ(RunNibble("generate --model " + out + " -n 4 --temperature 0", false).out,
            RunNibble("generate --model " + out + " -n 4 --temperature 0 --bf16_activations", false).out);
  RunResult gf = RunNibble("generate --model " + out + " -n 4 --temperature 0 --activations fp32");
  EXPECT_EQ(gf.exit_code, 0) << gf.out;
  EXPECT_NE(gf.out.find("activations: fp32 (W4A32) in 42 int4 linears ("), std::string::npos) << gf.out;
  RunResult gd = RunNibble("generate --model " + Quote(nibble_test::EmbeddedModel()) + " -n 1 --temperature 0");
  EXPECT_NE(gd.out.find("activations: fp32 (auto) (no int4 linears)"), std::string::npos) << gd.out;
  RunResult pj = RunNibble("perplexity --model " + out + " --text " + Quote(nibble_test::SharedData("prose-val.txt")) +
                           " --seq_len 128 --max_windows 1 --json", false);
  ASSERT_EQ(pj.exit_code, 0) << pj.out;
  EXPECT_EQ(nlohmann::json::parse(pj.out).at("activations"), "bf16");
  RunResult i = RunNibble("inspect --kernels");
  EXPECT_EQ(i.exit_code, 0) << i.out;
  EXPECT_NE(i.out.find("bf16 activations: "), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("activations (default --activations auto): "), std::string::npos) << i.out;
  // Linears the path cannot serve (g = 48) keep fp32 activations, and the run says how many.
  RunResult q48 = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out +
                            " --overwrite --layer_quant_config '*.mlp.down_proj:group_size=48'");
  ASSERT_EQ(q48.exit_code, 0) << q48.out;
  RunResult g48 = RunNibble("generate --model " + out + " -n 2 --temperature 0 --bf16_activations");
  EXPECT_EQ(g48.exit_code, 0) << g48.out;
  EXPECT_NE(g48.out.find("activations: bf16 (W4A16) in 36 int4 linears"), std::string::npos) << g48.out;
  EXPECT_NE(g48.out.find("6 int4 linears keep fp32 activations (group size not a multiple of 32)"), std::string::npos)
      << g48.out;
  std::system(("rm -rf " + out).c_str());
}

// The llama-perplexity workflow: the float model's logits saved once, then compare and perplexity
// against the saved logits give the numbers of a live base run; every --json is one object on
// stdout; sizes are printed the same by quantize and inspect.
TEST(Cli, SavedLogitsJsonAndOneSizeConvention) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  const std::string dir = "/tmp/nibble-cli-eval-" + std::to_string(getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string model = Quote(nibble_test::EmbeddedModel()), text = Quote(nibble_test::SharedData("prose-val.txt"));
  RunResult q = RunNibble("quantize --model_dir " + model + " --output_dir " + dir + "/q --json", false);
  ASSERT_EQ(q.exit_code, 0) << q.out;
  const nlohmann::json qj = nlohmann::json::parse(q.out);
  EXPECT_EQ(qj["size"]["quantized_linears"], 42);
  EXPECT_GT(qj["size"]["bits_per_weight"].get<double>(), 4.0);
  EXPECT_LT(qj["size"]["bits_per_weight"].get<double>(), 5.0);
  // quantize and inspect print the same size line.
  RunResult qt = RunNibble("quantize --model_dir " + model + " --output_dir " + dir + "/q --overwrite");
  RunResult in = RunNibble("inspect " + dir + "/q");
  std::smatch m1, m2;
  ASSERT_TRUE(std::regex_search(qt.out, m1, std::regex("size: [0-9.]+ bits/weight[^\n]*"))) << qt.out;
  ASSERT_TRUE(std::regex_search(in.out, m2, std::regex("size: [0-9.]+ bits/weight[^\n]*"))) << in.out;
  EXPECT_EQ(m1.str(), m2.str());

  RunResult p = RunNibble("perplexity --model " + model + " --text " + text + " --max_windows 2 --json --save_logits " + dir, false);
  ASSERT_EQ(p.exit_code, 0) << p.out;
  const nlohmann::json pj = nlohmann::json::parse(p.out);
  const double fp_ppl = pj["perplexity"]["ppl"];
  EXPECT_GT(pj["perplexity"]["ppl_stderr"].get<double>(), 0);
  EXPECT_EQ(pj["perplexity"]["scored_tokens"], 2 * 511);
  RunResult saved = RunNibble("compare --kl_divergence_base " + dir + " -q " + dir + "/q --text " + text + " --max_windows 2 --json", false);
  RunResult live = RunNibble("compare --model " + model + " -q " + dir + "/q --text " + text + " --max_windows 2 --json", false);
  ASSERT_EQ(saved.exit_code, 0) << saved.out;
  ASSERT_EQ(live.exit_code, 0) << live.out;
  const nlohmann::json sj = nlohmann::json::parse(saved.out), lj = nlohmann::json::parse(live.out);
  EXPECT_TRUE(sj["base_is_saved_logits"].get<bool>());
  EXPECT_DOUBLE_EQ(sj["base_perplexity"]["ppl"].get<double>(), fp_ppl);
  EXPECT_EQ(sj["models"][0]["kld"], lj["models"][0]["kld"]);
  EXPECT_EQ(sj["models"][0]["same_top_p"], lj["models"][0]["same_top_p"]);
  EXPECT_GT(sj["models"][0]["kld"]["mean"].get<double>(), 0);
  EXPECT_EQ(sj["models"][0]["size"]["bits_per_weight"], qj["size"]["bits_per_weight"]);
  // The compact form: half the size, the same statistics within 1e-4 (docs/FORMATS.md).
  RunResult u = RunNibble("perplexity --model " + model + " --text " + text + " --max_windows 2 --save_logits " + dir +
                          "/u16.bin --save_logits_format uint16", false);
  ASSERT_EQ(u.exit_code, 0) << u.out;
  RunResult us = RunNibble("compare --kl_divergence_base " + dir + "/u16.bin -q " + dir + "/q --text " + text + " --max_windows 2 --json", false);
  ASSERT_EQ(us.exit_code, 0) << us.out;
  const nlohmann::json uj = nlohmann::json::parse(us.out);
  for (const char* stat : {"mean", "median", "p99", "max"})
    EXPECT_NEAR(uj["models"][0]["kld"][stat].get<double>(), lj["models"][0]["kld"][stat].get<double>(), 1e-4) << stat;
  EXPECT_EQ(uj["models"][0]["same_top_p"], lj["models"][0]["same_top_p"]);
  EXPECT_LT(std::filesystem::file_size(dir + "/u16.bin"), std::filesystem::file_size(dir + "/nibble-logits.bin") * 51 / 100);
  const auto t0 = std::chrono::steady_clock::now();
  RunResult bad = RunNibble("perplexity --model " + model + " --text " + text + " --save_logits " + dir + "/x.bin --save_logits_format topk:0");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);  // refused before loading
  EXPECT_EQ(bad.exit_code, 2) << bad.out;  // a bad flag value: a usage error
  EXPECT_NE(bad.out.find("--save_logits_format \"topk:0\": expected fp32, uint16 or topk:K"), std::string::npos) << bad.out;
  RunResult k = RunNibble("perplexity --model " + dir + "/q --text " + text + " --max_windows 2 --threads 1 --kl_divergence_base " +
                          dir + "/nibble-logits.bin");
  ASSERT_EQ(k.exit_code, 0) << k.out;
  EXPECT_NE(k.out.find("Same top p"), std::string::npos) << k.out;
  EXPECT_NE(k.out.find("99.9%   KLD"), std::string::npos) << k.out;
  RunResult t = RunNibble("compare --kl_divergence_base " + dir + " -q " + dir + "/q --text " + text + " --max_windows 1 --threads 1");
  EXPECT_NE(t.out.find(", 1 thread\n"), std::string::npos) << t.out;
  // A damaged file is an error naming it.
  std::system(("head -c 1000 " + dir + "/nibble-logits.bin > " + dir + "/cut.bin").c_str());
  RunResult cut = RunNibble("perplexity --model " + dir + "/q --text " + text + " --max_windows 2 --kl_divergence_base " + dir + "/cut.bin");
  EXPECT_EQ(cut.exit_code, 1) << cut.out;
  EXPECT_NE(cut.out.find(dir + "/cut.bin: truncated"), std::string::npos) << cut.out;
  std::system(("rm -rf " + dir).c_str());
}

// An RTN report is summarized per linear and plotted.
TEST(Cli, RtnReportIsSummarizedAndPlotted) {
  const std::string dir = "/tmp/nibble-cli-rtn-report-" + std::to_string(getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  RunResult q = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + dir + "/q --report " +
                          dir + "/r.json");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  RunResult r = RunNibble("report " + dir + "/r.json --plot " + dir + "/p.png");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("per quantized linear (42):\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  layer 5: down_proj 0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kept in float: lm_head"), std::string::npos) << r.out;
  EXPECT_EQ(ReadFile(dir + "/p.png").substr(0, 4), "\x89PNG");
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace

namespace {

// stdout and stderr apart, and the wall time, of one nibble run.
struct TimedRun {
  int exit_code = -1;
  std::string out, err;
  double seconds = 0;
};

TimedRun RunTimed(const std::string& args) {
  nibble_test::TempDir tmp;
  const std::string err_file = tmp.path() + "/stderr";
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = RunCommand(Quote(nibble_test::NibbleBinary()) + " " + args + " 2>" + Quote(err_file));
  TimedRun t;
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t.exit_code = r.exit_code;
  t.out = r.out;
  t.err = ReadFile(err_file);
  return t;
}

struct FlagCase {
  std::string args;
  std::string expect;  // in the error
  int exit_code;       // 2: usage error, 1: a file named by a flag that cannot be read
};

// Every flag is checked before anything is loaded: a bad value is named, with exit code 2 (1
// for a file a flag names that cannot be read), nothing on stdout, long before a load could
// finish. The model directory does not exist, so any load would fail with another error: the
// flag's error proves nothing was opened. The same flags against a real model print nothing
// either (no "seed:", no echoed prompt).
TEST(Cli, FlagsAreCheckedBeforeAnythingIsLoaded) {
  nibble_test::TempDir tmp;
  const std::string bad_template = tmp.path() + "/bad.jinja";
  std::ofstream(bad_template) << "{% for m in messages %}{{ m.content }";
  const std::string none = "/nonexistent/nibble-model";
  const std::string g = "generate --model " + none + " --prompt hi ";
  const FlagCase cases[] = {
      {g + "--temperature -1", "--temperature -1", 2},
      {g + "--temperature nan", "--temperature nan", 2},
      {g + "--top_p 0", "--top_p 0", 2},
      {g + "--top_k -3", "--top_k -3", 2},
      {g + "--min_p 1.5", "--min_p 1.5", 2},
      {g + "--repeat_penalty 0", "--repeat_penalty 0", 2},
      {g + "--repeat_last_n -2", "--repeat_last_n -2", 2},
      {g + "--presence_penalty 2.5", "--presence_penalty 2.5 must be in [-2, 2]", 2},
      {g + "--frequency_penalty -3", "--frequency_penalty -3 must be in [-2, 2]", 2},
      {g + "-n -1", "--max_new_tokens -1", 2},
      {g + "--warmup -1", "--warmup -1", 2},
      {g + "--stop ''", "--stop: empty stop string", 2},
      {g + "--activations fp16", "expected auto, fp32, bf16 or int8", 2},
      {g + "--tokenizer sp", "expected auto, hf or spm", 2},
      {"generate --model " + none + " --chat --chat_template_kwargs '{bad'", "nibble: error: --chat_template_kwargs: ", 2},
      {"generate --model " + none + " --chat --chat_template_kwargs '[1]'", "expected a JSON object", 2},
      {"generate --model " + none + " --chat -n 0", "must be >= 1 with --chat", 2},
      {"generate --model " + none + " --chat --chat_template /nonexistent/t.jinja", "/nonexistent/t.jinja", 1},
      {"generate --model " + none + " --chat --chat_template " + Quote(bad_template), bad_template + ":1:", 1},
      {"generate --model " + none + " --system hi", "need --chat", 2},
      {"perplexity --model " + none + " --text x --seq_len 1", "--seq_len 1 is too small", 2},
      {"compare --model " + none + " -q " + none + " --text x --seq_len 1", "--seq_len 1", 2},
      {"compare --model " + none + " --methods rtn,gptx --text x", "\"gptx\" is not a method", 2},
      {"compare --model " + none + " --methods rtn,awq --text x", "--methods awq needs calibration data", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --quant_algo gtpq", "--quant_algo \"gtpq\"", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --max_shard_size 5XB", "--max_shard_size", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --misaligned pad", "--misaligned \"pad\"", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --model_export gguf", "--model_export", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --group_size 0", "--group_size 0", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --quant_algo awq --dataset /nonexistent/c.txt",
       "--dataset /nonexistent/c.txt: no such file", 1},
      {"convert --in " + none + " --out /tmp/nibble-unused-out --to gguf", "--to", 2},
      {"export-onnx --model " + none + " --out /tmp/nibble-unused-out --io_dtype bf16", "--io_dtype \"bf16\"", 2},
      {"export-onnx --model " + none + " --out /tmp/nibble-unused-out --accuracy_level 9", "--accuracy_level", 2},
      {"bench-model -m " + none + " -r 0", "-r 0 must be >= 1", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --threads 99999",
       "--threads: Value 99999 not in range 0 to 1024", 2},
      {"perplexity --model " + none + " --text x --threads -3", "--threads: Value -3 not in range 0 to 1024", 2},
      {"compare --model " + none + " -q " + none + " --text x --threads 1025", "--threads: Value 1025", 2},
      {"synth --config " + none + " --out /tmp/nibble-unused-out --threads 2000", "--threads: Value 2000", 2},
      {"serve --model " + none + " --threads 5000", "--threads: Value 5000", 2},
      {"bench --threads 4000 --no_bandwidth", "--threads: Value 4000", 2},
      {"bench-model -m " + none + " --activations fp8", "unknown mode \"fp8\"", 2},
      {"inspect " + none + " --all", "--all goes with --engines", 2},
      {"inspect", "a model directory is required", 2},
      {"tokenize --model " + none + " --text a --file b", "excludes", 2},
      {"tokenize --model " + none + " --text a --tokenizer sp", "expected auto, hf or spm", 2},
      {"verify " + none, "B is required", 2},
      {"synth --config " + none + " --out /tmp/nibble-unused-out --format gguf", "--format \"gguf\"", 2},
      {"synth --config " + none + " --out /tmp/nibble-unused-out --group_size 0", "--group_size", 2},
      {"report", "files is required", 2},
      {"bench --shapes 4096 --no_bandwidth", "--shapes: expected KxN", 2},
      {"bench --m 0 --no_bandwidth", "--m 0 must be >= 1", 2},
      {"bench --group_size 48 --shapes 4096x64 --no_bandwidth", "K 4096 is not a multiple of --group_size 48", 2},
      {"tokenize --model " + none, "give --text STRING or --file FILE", 2},
      {"bench-model -m " + none + " --ctx_size 32 -p 64", "--ctx_size 32 is smaller than the longest test", 2},
      {"bench-model -m " + none + " --ctx_size 32 -p 8 --chunk 64", "--ctx_size 32 is smaller than the longest test", 2},
      {"bench-model -m " + none + " --chunk -1", "--chunk -1 must be >= 0", 2},
      {"bench-model -m " + none + " --chunk 8 --chunk_every 0", "--chunk_every 0 must be >= 1", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --gptq_format v3", "--gptq_format \"v3\"", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --tp 0", "--tp: must be an integer >= 1", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --actorder group --quant_algo rtn", "--actorder group is a GPTQ setting; --quant_algo rtn", 2},
      {"quantize --model_dir " + none + " --output_dir /tmp/nibble-unused-out --quant_algo awq --actorder static", "--quant_algo awq does not use it", 2},
      {g + "--seed -1", "--seed: expected an integer in [0, 18446744073709551615], got \"-1\"", 2},
      {g + "--seed 99999999999999999999", "got \"99999999999999999999\"", 2},
      {g + "--temperature 0.5 --temperature 0.7", "--temperature given 2 times (once expected)", 2},
      {"perplexity --model " + none + " --text x --max_windows -1", "--max_windows: must be an integer >= 0, got \"-1\"", 2},
      {"perplexity --model " + none + " --text x --save_logits_format uint16", "--save_logits_format requires --save_logits", 2},
      {"compare --model " + none + " -q " + none + " --text x --save_logits_format uint16",
       "--save_logits_format requires --save_logits", 2},
      {"compare --model " + none + " -q " + none + " --text x --max_windows -1", "--max_windows: must be an integer >= 0", 2},
      {"export-onnx --in " + none, "export-onnx: unknown option --in (see nibble export-onnx --help)", 2},
      {"export-onnx --model " + none + " --out /tmp/nibble-unused-out --io_dtyp fp32",
       "unknown option --io_dtyp (did you mean --io_dtype?)", 2},
  };
  for (const FlagCase& c : cases) {
    const TimedRun r = RunTimed(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("nibble: error: "), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.find(none + ":"), std::string::npos) << c.args << ": the model was opened\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
    EXPECT_LT(r.seconds, 0.5) << c.args;
  }
  // Against a real model: nothing is loaded or printed before the error either.
  const std::string model = Quote(nibble_test::EmbeddedModel());
  for (const std::string flags : {"--temperature -1", "--top_p 0", "--chat --chat_template_kwargs '{bad'"}) {
    const std::string prompt = std::string(flags).find("--chat") == std::string::npos ? " --prompt hi " : " ";
    const TimedRun r = RunTimed("generate --model " + model + prompt + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_EQ(r.out, "") << flags;
    EXPECT_EQ(r.err.find("seed:"), std::string::npos) << flags << "\n" << r.err;
    EXPECT_EQ(r.err.find("activations:"), std::string::npos) << flags << ": the model was loaded\n" << r.err;
  }
}

// One exit-code scheme: 2 for usage errors (CLI11's own codes are 105, 106, 109, ...), 1 for
// runtime errors, 0 for success and --help.
TEST(Cli, UsageErrorsExitWithTwoRuntimeErrorsWithOne) {
  const std::string model = Quote(nibble_test::EmbeddedModel());
  EXPECT_EQ(RunNibble("generate --model " + model + " --frobnicate 3").exit_code, 2);
  EXPECT_EQ(RunNibble("generate --prompt hi").exit_code, 2);                       // required --model
  EXPECT_EQ(RunNibble("generate --model " + model + " -n abc").exit_code, 2);      // not a number
  EXPECT_EQ(RunNibble("generate --model " + model + " --threads -2").exit_code, 2);  // CLI11 range check
  EXPECT_EQ(RunNibble("bogus").exit_code, 2);
  EXPECT_EQ(RunNibble("generate --model /nonexistent/dir -n 1").exit_code, 1);
  // A calibration file that is empty or shorter than one --seq_len chunk is the file's fault: 1.
  nibble_test::TempDir tmp;
  std::ofstream(tmp.path() + "/empty.txt").close();
  std::ofstream(tmp.path() + "/short.txt") << "Once upon a time.";
  const std::string awq = "quantize --model_dir " + model + " --output_dir " + Quote(tmp.sub("q")) + " --quant_algo awq --dataset ";
  RunResult d = RunNibble(awq + Quote(tmp.path() + "/empty.txt"));
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_NE(d.out.find("empty.txt: no calibration text"), std::string::npos) << d.out;
  d = RunNibble(awq + Quote(tmp.path() + "/short.txt") + " --seq_len 64");
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_NE(d.out.find("short.txt: calibration data has"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("fewer than one chunk of --seq_len 64"), std::string::npos) << d.out;
  std::ofstream(tmp.path() + "/binary.txt") << std::string("\xff\xfe\x00\x81 not text", 12);
  d = RunNibble(awq + Quote(tmp.path() + "/binary.txt"));
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_NE(d.out.find("binary.txt: calibration text 1: input text is not valid UTF-8"), std::string::npos) << d.out;
  // An output path that no --overwrite could replace (a file, a non-model directory) says so at
  // once, not "pass --overwrite".
  for (const std::string ow : {"", " --overwrite"}) {
    d = RunNibble("quantize --model_dir " + model + " --output_dir " + Quote(tmp.path() + "/short.txt") + ow);
    EXPECT_EQ(d.exit_code, 1) << d.out;
    EXPECT_NE(d.out.find("short.txt exists and is not a directory; refusing to replace it"), std::string::npos) << d.out;
    EXPECT_EQ(d.out.find("pass --overwrite"), std::string::npos) << d.out;
  }
  // An output place that cannot be written (a filesystem without blocks) is named as such: 1.
  d = RunNibble("quantize --model_dir " + model + " --output_dir /proc/nibble-never/out");
  EXPECT_EQ(d.exit_code, 1) << d.out;
  EXPECT_NE(d.out.find("cannot write the output under /proc"), std::string::npos) << d.out;
  EXPECT_EQ(RunNibble("generate --help").exit_code, 0);
  EXPECT_EQ(RunNibble("--version").exit_code, 0);
  const RunResult r = RunNibble("perplexity --text x");
  EXPECT_NE(r.out.find("nibble: error: --model is required (see nibble perplexity --help)"), std::string::npos) << r.out;
}

// --model / --out are accepted where the command spells them --model_dir / --output_dir and the
// other way round; an unknown flag names the closest known one.
TEST(Cli, ModelAndOutputFlagsHaveEachOthersSpellings) {
  nibble_test::TempDir tmp;
  const std::string model = Quote(nibble_test::EmbeddedModel());
  const RunResult q = RunNibble("quantize --model " + model + " --out " + Quote(tmp.path() + "/q"));
  ASSERT_EQ(q.exit_code, 0) << q.out;
  const RunResult g = RunNibble("generate --model_dir " + Quote(tmp.path() + "/q") + " -n 2 --temperature 0 --prompt hi");
  EXPECT_EQ(g.exit_code, 0) << g.out;
  const RunResult c = RunNibble("convert --model " + Quote(tmp.path() + "/q") + " --output_dir " + Quote(tmp.path() + "/c") +
                                " --to compressed-tensors");
  EXPECT_EQ(c.exit_code, 0) << c.out;
  const RunResult t = RunNibble("tokenize --model_dir " + model + " --text hi");
  EXPECT_EQ(t.exit_code, 0) << t.out;
  const RunResult s = RunNibble("quantize --model_d " + model + " --out x");
  EXPECT_EQ(s.exit_code, 2) << s.out;
  EXPECT_NE(s.out.find("unknown option --model_d (did you mean --model_dir?)"), std::string::npos) << s.out;
  const RunResult p = RunNibble("convert --in x --out y --to awq --pack");
  EXPECT_NE(p.out.find("unknown option --pack (did you mean --pack_method?)"), std::string::npos) << p.out;
}

// --stop takes several strings, in one flag or repeated, as its help says.
TEST(Cli, StopTakesSeveralStrings) {
  const std::string model = Quote(nibble_test::EmbeddedModel());
  const RunResult ref = RunNibble("generate --model " + model + " -n 24 --temperature 0 --prompt 'And God said'", false);
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const std::string text = ref.out.substr(std::string("And God said").size());
  ASSERT_GT(text.size(), 12u) << ref.out;
  const std::string stop = text.substr(6, 3);  // a piece of the continuation
  for (const std::string& flags : {"--stop zzqx " + Quote(stop), "--stop zzqx --stop " + Quote(stop)}) {
    const RunResult r = RunNibble("generate --model " + model + " -n 24 --temperature 0 --prompt 'And God said' " + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find("stop: stop string \"" + stop + "\""), std::string::npos) << flags << "\n" << r.out;
  }
  const RunResult h = RunNibble("generate --help");
  EXPECT_NE(h.out.find("--stop A B or --stop A --stop B"), std::string::npos) << h.out;
}

// inspect --engines prints one per-linear table: only the linears where an engine disagrees,
// every one with --all.
TEST(Cli, InspectEnginesPrintsOneTable) {
  nibble_test::TempDir tmp;
  const std::string out = Quote(tmp.path() + "/q");
  ASSERT_EQ(RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " + out +
                      " --layer_quant_config 'model.layers.0.self_attn.q_proj:group_size=32'").exit_code, 0);
  auto count = [](const std::string& s, const std::string& row) {  // table rows: lines that start with it
    size_t n = 0;
    for (size_t p = s.find("\n" + row); p != std::string::npos; p = s.find("\n" + row, p + 1)) ++n;
    return n;
  };
  const RunResult e = RunNibble("inspect " + out + " --engines");
  ASSERT_EQ(e.exit_code, 0) << e.out;
  EXPECT_EQ(count(e.out, "model.layers.1.mlp.down_proj "), 0u) << e.out;  // every engine agrees there
  EXPECT_EQ(count(e.out, "model.layers.0.self_attn.q_proj "), 1u) << e.out;
  EXPECT_NE(e.out.find("linears where an engine disagrees; --all lists every one"), std::string::npos) << e.out;
  const RunResult a = RunNibble("inspect " + out + " --engines --all");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(count(a.out, "model.layers.1.mlp.down_proj "), 1u) << a.out;
  const RunResult plain = RunNibble("inspect " + out);
  EXPECT_EQ(count(plain.out, "model.layers.1.mlp.down_proj "), 1u) << plain.out;
}

// ONNX Runtime GenAI reads no compressed-tensors checkpoint: one note saying so and what to run
// instead, not a warning that it misreads each linear (the float lm_head among them).
TEST(Cli, CompressedTensorsExportNotesThatOrtGenAiDoesNotReadIt) {
  nibble_test::TempDir tmp;
  const RunResult q = RunNibble("quantize --model_dir " + Quote(nibble_test::EmbeddedModel()) + " --output_dir " +
                                Quote(tmp.path() + "/ct") + " --model_export compressed-tensors");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  EXPECT_EQ(q.out.find("onnxruntime-genai misreads"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("note: onnxruntime-genai does not read this checkpoint"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("nibble export-onnx"), std::string::npos) << q.out;
}

}  // namespace
