// Output robustness of `nibble quantize`: SIGKILL at random moments never leaves a
// complete-looking partial checkpoint; stale staging directories are cleaned by the next run;
// unwritable / full outputs give clear errors; outputs are byte-identical across runs and thread
// counts (sha256 of every file).
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/mount.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <nibble/nibble.h>

#include "test_paths.h"

namespace fs = std::filesystem;

namespace {

std::string MakeTempDir() {
  char tmpl[] = "/tmp/nibble-robust-XXXXXX";
  return mkdtemp(tmpl);
}

// Starts `nibble quantize` of the embedded model into `out`; returns the child's pid.
pid_t StartQuantize(const std::string& out, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {nibble_test::NibbleBinary(), "quantize", "--model_dir", nibble_test::EmbeddedModel(),
                                   "--output_dir", out};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

std::string Sha256File(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string data = ss.str();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  char buf[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", md[i]);
    hex += buf;
  }
  return hex;
}

std::map<std::string, std::string> HashDir(const std::string& dir) {
  std::map<std::string, std::string> h;
  for (const auto& e : fs::directory_iterator(dir)) h[e.path().filename().string()] = Sha256File(e.path().string());
  return h;
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
    Wait(pid);
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
  ASSERT_EQ(Wait(StartQuantize(out)), 0);
  for (const auto& e : fs::directory_iterator(tmp))
    EXPECT_EQ(e.path().filename().string().find(".nibble-tmp-"), std::string::npos) << "stale " << e.path();
  fs::remove_all(tmp);
}

TEST(QuantizeOutput, ByteIdenticalAcrossRunsAndThreadCounts) {
  const std::string tmp = MakeTempDir();
  ASSERT_EQ(Wait(StartQuantize(tmp + "/a", {"--threads", "1"})), 0);
  ASSERT_EQ(Wait(StartQuantize(tmp + "/b", {"--threads", "2"})), 0);
  ASSERT_EQ(Wait(StartQuantize(tmp + "/c", {"--threads", "2"})), 0);
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
