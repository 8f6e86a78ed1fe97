// Loading holds the weights once: a Llama-3.1-8B config (bench/configs/llama3.1-8b.json) trimmed
// to 2 layers, at full width with the full vocabulary (128256, untied bf16 lm_head) and
// max_position_embeddings 131072, synthesized as an int4 Quark checkpoint (2.2 GB). The process's peak RSS during Model::Load grows by less than 1.3x the weight bytes
// the model holds (the mapped file and the repacked copy are never resident together), and a
// session's memory follows its ctx_size, not max_position_embeddings. The same for a load that
// packs into the packed-weight cache and one that maps it, with the logits of the first.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

// Resets VmHWM to the current RSS (Linux >= 4.0), so it measures the load alone.
bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// Loads `dir` with `lo`, checking that peak RSS grows by less than 1.3x the weights held.
std::unique_ptr<nibble::Model> LoadMeasured(const std::string& dir, const nibble::LoadOptions& lo, int64_t file_bytes) {
  const int64_t rss_before = nibble_test::ProcStatusBytes("VmRSS");
  EXPECT_TRUE(ResetPeakRss()) << "/proc/self/clear_refs";
  auto m = nibble::Model::Load(dir, lo);
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (!m.ok()) return nullptr;
  const int64_t peak = nibble_test::ProcStatusBytes("VmHWM"), rss_after = nibble_test::ProcStatusBytes("VmRSS");
  const nibble::ModelInfo& info = (*m)->info();
  EXPECT_GT(rss_before, 0);
  std::printf("load (%s): %.2f s, peak RSS +%.1f MiB, RSS +%.1f MiB, weights %.1f MiB, files %.1f MiB\n",
              nibble::LoadSummary(info).c_str(), info.load_seconds, (peak - rss_before) / 1048576.0,
              (rss_after - rss_before) / 1048576.0, info.weight_bytes / 1048576.0, file_bytes / 1048576.0);
  // The packed int4 linears and the bf16 embedding and lm_head: about the file's size.
  EXPECT_GT(info.weight_bytes, file_bytes * 8 / 10) << "file " << file_bytes;
  EXPECT_LT(info.weight_bytes, file_bytes * 12 / 10) << "file " << file_bytes;
  EXPECT_GT(info.load_seconds, 0);
  EXPECT_EQ(info.int4_linears, 14);
  EXPECT_LT(peak - rss_before, info.weight_bytes * 13 / 10)
      << "peak RSS during load grew by " << (peak - rss_before) << " bytes for " << info.weight_bytes
      << " bytes of weights (file " << file_bytes << ")";
  EXPECT_LT(rss_after - rss_before, info.weight_bytes * 13 / 10);
  EXPECT_NE(nibble::LoadSummary(info).find("loaded in "), std::string::npos);
  return std::move(m).value();
}

TEST(LoadMemory, WeightsResidentOnceAndSessionFollowsCtxSize) {
#ifdef NIBBLE_TEST_ASAN
  GTEST_SKIP() << "RSS under AddressSanitizer counts its shadow memory";
#endif
  nibble_test::TempDir tmp("nibble_load_memory_");
  std::ifstream in(nibble_test::SourceDir() + "/bench/configs/llama3.1-8b.json");
  nlohmann::json c = nlohmann::json::parse(in);
  c["num_hidden_layers"] = 2;
  ASSERT_EQ(c["vocab_size"], 128256);
  ASSERT_EQ(c["max_position_embeddings"], 131072);
  const std::string config = tmp.path() + "/config.json", dir = tmp.path() + "/model";
  std::ofstream(config) << c.dump(2);
  // The CLI synthesizes in its own process, so this process's peak RSS is the load's alone.
  const nibble_test::RunResult r =
      nibble_test::RunNibble("synth --config " + nibble_test::Quote(config) + " --out " + nibble_test::Quote(dir));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  int64_t file_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") file_bytes += static_cast<int64_t>(e.file_size());

  nibble::LoadOptions lo;
  lo.activations = nibble::ActivationType::kFp32;
  lo.weight_cache = false;
  auto m = LoadMeasured(dir, lo, file_bytes);
  ASSERT_NE(m, nullptr);
  // KV bytes per position: K and V, 2 layers, 8 kv heads of head_dim 128, bf16.
  const int64_t per_pos = 2 * 2 * 8 * 128 * 2;
  EXPECT_EQ(nibble::DefaultContextSize(*m), 8192);
  EXPECT_EQ(nibble::KvCacheBytes(*m, 8192), 8192 * per_pos);
  const int64_t rss_model = nibble_test::ProcStatusBytes("VmRSS");
  nibble::SessionOptions so;
  so.context = 8192;
  auto s = nibble::Session::Create(*m, so);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ((*s)->capacity(), 8192);
  EXPECT_EQ((*s)->kv_bytes(), 0);
  // The session's own tables (RoPE for 8192 positions) are far below a 131072-position cache.
  EXPECT_LT(nibble_test::ProcStatusBytes("VmRSS") - rss_model, nibble::KvCacheBytes(*m, 131072) / 8);
  ASSERT_TRUE((*s)->Prefill(std::vector<int32_t>(10, 5)).ok());
  EXPECT_EQ((*s)->kv_bytes(), 256 * per_pos);
  (*s).reset();
  const std::vector<int32_t> ids = {1, 500, 90000, 7};
  const auto want = m->Logits(ids);
  ASSERT_TRUE(want.ok());
  m.reset();

  // The packed-weight cache: packing into its file, then mapping it, hold the weights once too.
  lo.weight_cache = true;
  lo.weight_cache_dir = tmp.path() + "/cache";
  for (const bool hit : {false, true}) {
    auto c = LoadMeasured(dir, lo, file_bytes);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->info().weight_cache_hit, hit);
    EXPECT_NE(c->info().weight_cache, "");
    EXPECT_EQ(c->Logits(ids).value(), *want) << (hit ? "mapped" : "packed");
  }
}

}  // namespace
