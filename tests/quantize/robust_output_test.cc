// Output robustness of `nibble quantize`: SIGKILL at random moments never leaves a
// complete-looking partial checkpoint; stale staging directories are cleaned by the next run;
// unwritable / full outputs give clear errors; outputs are byte-identical across runs and thread
// counts (sha256 of every file).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nibble/nibble.h>

#include "e2e/run_nibble.h"
#include "test_paths.h"

namespace fs = std::filesystem;

namespace {

std::string MakeTempDir() {
  char tmpl[] = "/tmp/nibble-robust-XXXXXX";
  return mkdtemp(tmpl);
}

using nibble_test::HashDir;
using nibble_test::WaitExit;

// Starts `nibble quantize` of the embedded model into `out`, output to /dev/null; returns its pid.
pid_t StartQuantize(const std::string& out, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"quantize", "--model_dir", nibble_test::EmbeddedModel(), "--output_dir", out};
  args.insert(args.end(), extra.begin(), extra.end());
  return nibble_test::SpawnNibble(args);
}

TEST(QuantizeOutput, SigkillNeverLeavesPartialCheckpoint) {
  const std::string tmp = MakeTempDir();
  const std::string out = tmp + "/out";
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> delay_us(0, 400000);
  int complete = 0, absent = 0;
  for (int i = 0; i < 20; ++i) {
    fs::remove_all(out);
    pid_t pid = StartQuantize(out);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    kill(pid, SIGKILL);
    WaitExit(pid);
    if (!fs::exists(out)) {
      ++absent;
      continue;
    }
    // Whatever is at the target must be complete and loadable.
    ++complete;
    auto m = nibble::Model::Load(out);
    ASSERT_TRUE(m.ok()) << "kill " << i << ": partial output at target: " << m.error().message;
    EXPECT_EQ((*m)->info().weight_format, "quark");
  }
  std::printf("20 SIGKILLs: %d left nothing, %d left a complete checkpoint\n", absent, complete);
  // The next run cleans staging directories left by killed runs.
  fs::remove_all(out);
  ASSERT_EQ(WaitExit(StartQuantize(out)), 0);
  for (const auto& e : fs::directory_iterator(tmp))
    EXPECT_EQ(e.path().filename().string().find(".nibble-tmp-"), std::string::npos) << "stale " << e.path();
  fs::remove_all(tmp);
}

TEST(QuantizeOutput, ByteIdenticalAcrossRunsAndThreadCounts) {
  const std::string tmp = MakeTempDir();
  ASSERT_EQ(WaitExit(StartQuantize(tmp + "/a", {"--threads", "1"})), 0);
  ASSERT_EQ(WaitExit(StartQuantize(tmp + "/b", {"--threads", "2"})), 0);
  ASSERT_EQ(WaitExit(StartQuantize(tmp + "/c", {"--threads", "2"})), 0);
  const auto a = HashDir(tmp + "/a"), b = HashDir(tmp + "/b"), c = HashDir(tmp + "/c");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_EQ(b, c);
  for (const auto& [f, h] : a) std::printf("  %s  %s\n", h.c_str(), f.c_str());
  fs::remove_all(tmp);
}

TEST(QuantizeOutput, UnwritableOutputIsANamedError) {
  const std::string tmp = MakeTempDir();
  std::ofstream(tmp + "/file") << "x";
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp + "/file/out";  // parent is a regular file
  auto s = nibble::Quantize(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(tmp + "/file"), std::string::npos) << s.error().message;
  fs::remove_all(tmp);
}

TEST(QuantizeOutput, DiskFullLeavesNothingAtTarget) {
  const std::string tmp = MakeTempDir();
  // A 2 MB tmpfs cannot hold the ~6.7 MB checkpoint: the disk plan refuses the run before it
  // writes anything (quantize/resource_plan.h), naming the bytes needed and free. Needs mount
  // privileges; skipped without.
  if (mount("tmpfs", tmp.c_str(), "tmpfs", 0, "size=2m") != 0) {
    fs::remove_all(tmp);
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << ")";
  }
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp + "/out";
  auto s = nibble::Quantize(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, nibble::ErrorCode::kResourceExhausted) << s.error().message;
  EXPECT_NE(s.error().message.find("of disk while it is written"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("free at " + tmp), std::string::npos) << s.error().message;
  EXPECT_FALSE(fs::exists(r.output_dir));
  size_t leftovers = 0;
  for (const auto& e : fs::directory_iterator(tmp)) { (void)e; ++leftovers; }
  EXPECT_EQ(leftovers, 0u) << "staging directory left behind";
  umount(tmp.c_str());
  fs::remove_all(tmp);
}

}  // namespace
