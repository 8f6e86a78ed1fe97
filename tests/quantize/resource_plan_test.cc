// The memory and disk plan of `nibble quantize` (quantize/resource_plan.h) against what a run
// measures: the planned peak of anonymous memory bounds the measured one (the run's own sampler,
// RssAnon every 20 ms, in a process of its own) and is not far above it, for RTN, AWQ and GPTQ;
// --max_memory below the plan refuses before any layer with the numbers; the per-stage progress
// lines appear in a log; a disk too small for the output is refused with the numbers.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nibble/nibble.h>
#include <nlohmann/json.hpp>

#include "quantize/resource_plan.h"
#include "test_paths.h"
#include "test_util.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using nibble_test::TempDir;

struct CliRun {
  int exit_code = -1;
  std::string out, err;  // stdout, stderr
};

// The CLI's `quantize` with `flags` (stdout and stderr apart; stderr is a file, not a terminal).
CliRun Quantize(const TempDir& tmp, const std::string& flags) {
  const fs::path err = fs::path(tmp.path()) / "stderr.txt";
  const std::string cmd = nibble_test::NibbleBinary() + " quantize --model_dir " + nibble_test::EmbeddedModel() +
                          " --threads 2 " + flags + " 2>" + err.string();
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(err);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

// Plan >= measured peak and below twice it, for one run given by its flags.
void ExpectPlanBoundsPeak(const std::string& what, const std::string& flags) {
  TempDir tmp;
  const CliRun r = Quantize(tmp, "--output_dir " + (fs::path(tmp.path()) / "q").string() + " --json " + flags);
  ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const double measured = j["peak_anon_bytes"].get<double>(), planned = j["plan"]["peak_anon_bytes"].get<double>();
  ASSERT_GT(measured, 0) << what;
  EXPECT_GE(planned, measured) << what << ": the plan is below the measured peak\n" << j["plan"].dump(2);
  EXPECT_LT(planned, 2 * measured) << what << ": the plan is more than twice the measured peak\n" << j["plan"].dump(2);
  EXPECT_NE(r.err.find("plan: expected peak "), std::string::npos) << r.err;
}

std::string Calib(int64_t chunks, int64_t seq_len) {
  return "--dataset " + nibble_test::SharedData("prose-calib.txt") + " --num_calib_data " + std::to_string(chunks) +
         " --seq_len " + std::to_string(seq_len);
}

TEST(ResourcePlan, PeakBoundsTheMeasuredPeakForRtnAwqGptq) {
#ifdef NIBBLE_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine are not in the plan";
#endif
  if (const std::string m = nibble_test::MissingShared({"data/prose-calib.txt"}); !m.empty()) GTEST_SKIP() << m;
  ExpectPlanBoundsPeak("rtn", "");
  // bf16 (the model's dtype): the chunked layer, below the tokenization's peak at 8 x 512; fp32:
  // every row's activations at once, enough rows that a decoder layer sets the peak.
  ExpectPlanBoundsPeak("gptq", "--quant_algo gptq " + Calib(8, 512));
  ExpectPlanBoundsPeak("gptq fp32", "--quant_algo gptq --calib_dtype fp32 " + Calib(8, 512));
  ExpectPlanBoundsPeak("awq", "--quant_algo awq --n_grid 2 --duo_scaling false " + Calib(8, 512));
  ExpectPlanBoundsPeak("awq fp32", "--quant_algo awq --n_grid 2 --duo_scaling false --calib_dtype fp32 " + Calib(8, 512));
}

TEST(ResourcePlan, MaxMemoryBelowThePlanRefusesBeforeAnyLayer) {
  if (const std::string m = nibble_test::MissingShared({"data/prose-calib.txt"}); !m.empty()) GTEST_SKIP() << m;
  TempDir tmp;
  const fs::path out = fs::path(tmp.path()) / "q";
  // fp32: every row's activations, so a layer (not the tokenization) is the peak at 8 x 512.
  const CliRun r = Quantize(tmp, "--output_dir " + out.string() + " --quant_algo gptq --calib_dtype fp32 --max_memory 20MB " +
                                     Calib(8, 512));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("expected peak "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" > --max_memory 20.0 MB at quantize and report (model.layers."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("largest terms: "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("layer 1/"), std::string::npos) << "a layer started:\n" << r.err;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(tmp.path()))  // no staging directory either
    EXPECT_FALSE(e.path().filename().string().starts_with(".q.")) << e.path();
  // A bad size is named as serve and generate name it.
  const CliRun bad = Quantize(tmp, "--output_dir " + out.string() + " --max_memory 12XB");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--max_memory"), std::string::npos) << bad.err;
}

TEST(ResourcePlan, ProgressLinesPerLayerAndStageInALog) {
  if (const std::string m = nibble_test::MissingShared({"data/prose-calib.txt"}); !m.empty()) GTEST_SKIP() << m;
  TempDir tmp;
  const CliRun rtn = Quantize(tmp, "--output_dir " + (fs::path(tmp.path()) / "r").string());
  ASSERT_EQ(rtn.exit_code, 0) << rtn.err;
  EXPECT_NE(rtn.err.find("rtn layer 6/6 quantize, "), std::string::npos) << rtn.err;
  const CliRun g = Quantize(tmp, "--output_dir " + (fs::path(tmp.path()) / "g").string() + " --quant_algo gptq " + Calib(2, 64));
  ASSERT_EQ(g.exit_code, 0) << g.err;
  for (const char* stage : {"load", "calibrate", "quantize", "write"})
    EXPECT_NE(g.err.find(std::string("gptq layer 3/6 ") + stage + ", "), std::string::npos) << stage << "\n" << g.err;
  EXPECT_NE(g.err.find("gptq layers 1/6"), std::string::npos) << g.err;  // the per-layer log stays
  const size_t at = g.err.find("gptq layer 6/6 write, ");
  ASSERT_NE(at, std::string::npos) << g.err;
  const std::string line = g.err.substr(at, g.err.find('\n', at) - at);
  EXPECT_NE(line.find(" s elapsed, ETA "), std::string::npos) << line;
  EXPECT_NE(line.find(", RSS "), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  EXPECT_LT(g.err.find("plan: "), g.err.find("gptq layer 1/6 load")) << "the plan comes before the first layer";
}

// A resumable calibrated run stages its next layer input at every boundary, the new file beside
// the last until the manifest names it: the plan's disk covers the staging directory with a second
// activations file at every stage (64 x 512 tokens: the activations outweigh the output here).
TEST(ResourcePlan, DiskCoversTheStagedActivations) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  TempDir tmp;
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  r.quant_algo = "gptq";
  r.dataset = nibble_test::SharedData("prose-calib.txt");
  r.num_calib_data = 64;
  r.seq_len = 512;
  r.resumable = true;
  int64_t staged_peak = 0;
  r.on_stage = [&](const nibble::QuantizeStage&) {
    int64_t total = 0, largest_activations = 0;
    for (const auto& d : fs::directory_iterator(tmp.path()))
      if (d.path().filename().string().starts_with(".out.nibble-tmp-"))
        for (const auto& f : fs::directory_iterator(d.path())) {
          const int64_t size = static_cast<int64_t>(f.file_size());
          total += size;
          if (f.path().filename().string().starts_with("activations-"))
            largest_activations = std::max(largest_activations, size);
        }
    staged_peak = std::max(staged_peak, total + largest_activations);
  };
  auto q = nibble::Quantize(r);
  ASSERT_TRUE(q.ok()) << q.error().message;
  const auto plan = nlohmann::json::parse(q->plan_json);
  EXPECT_GT(staged_peak, plan.at("output_bytes").get<int64_t>());
  EXPECT_LE(staged_peak, plan.at("disk_bytes").get<int64_t>());
}

TEST(ResourcePlan, OutputAboveTheFreeDiskIsRefusedWithTheNumbers) {
  nibble::ResourcePlan p;
  p.peak_bytes = 1000;
  p.output_bytes = 3000000000;
  p.disk_bytes = 5000000000;
  p.free_disk_bytes = 2000000000;
  p.disk_dir = "/data";
  const nibble::Status st = nibble::CheckResources(p, -1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, nibble::ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().message.find("5.0 GB of disk"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("2.0 GB free at /data"), std::string::npos) << st.error().message;
  p.free_disk_bytes = 6000000000;
  EXPECT_TRUE(nibble::CheckResources(p, -1).ok());
  EXPECT_FALSE(nibble::CheckResources(p, 999).ok());  // the peak above an explicit limit
  EXPECT_TRUE(nibble::CheckResources(p, 1000).ok());
}

// An output under a filesystem without blocks (/proc: statvfs reports 0 free bytes) or under a
// directory this process cannot write is refused as such before any work, not as a full disk.
TEST(ResourcePlan, UnwritableOutputPlaceIsNamedNotCalledFull) {
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = "/proc/nibble-never/out";
  auto q = nibble::Quantize(r);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().code, nibble::ErrorCode::kIo) << q.error().message;
  EXPECT_NE(q.error().message.find("cannot write the output under /proc: not on a disk filesystem"), std::string::npos)
      << q.error().message;
  EXPECT_EQ(q.error().message.find(" free at "), std::string::npos) << q.error().message;
  if (geteuid() == 0) return;  // (root writes into a mode 0555 directory)
  nibble_test::TempDir tmp;
  const std::string ro = tmp.sub("ro");
  std::filesystem::create_directories(ro);
  std::filesystem::permissions(ro, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  r.output_dir = ro + "/out";
  q = nibble::Quantize(r);
  std::filesystem::permissions(ro, std::filesystem::perms::owner_all);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("cannot write the output under " + ro + ": not writable"), std::string::npos)
      << q.error().message;
}

}  // namespace
