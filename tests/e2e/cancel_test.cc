// Ctrl-C (SIGINT) and SIGTERM during a long command: the command stops at the library's next
// cancellation check, prints "nibble: cancelled: ... (SIGINT)", exits 128 + the signal (130,
// 143: the shell's convention) and leaves no output and no staging directory. (The handler's
// reset to the default action, which lets a second Ctrl-C kill, is tests/tools/cancel_signal_test.cc.)
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::ReadFile;

// Starts `nibble ARGS` with stdout and stderr to `log`; returns its pid.
pid_t StartNibble(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv_s = {nibble_test::NibbleBinary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    // As a shell starts a foreground job: a test runner started in the background has SIGINT
    // ignored, and nibble leaves an ignored signal ignored.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Polls `log` until it holds `text` (true) or the process ended / 120 s passed (false).
bool WaitForOutput(pid_t pid, const std::string& log, const std::string& text) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < end) {
    if (ReadFile(log).find(text) != std::string::npos) return true;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// The exit code, or -signal when a signal killed it.
int WaitExit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

// GPTQ of the embedded model on 16 x 128 calibration tokens (the first 60 kB of prose-calib.txt
// in `calib`): about 0.2 s per layer on one thread, so a signal sent when the first of its 6
// layers is logged lands in the middle of the run.
std::vector<std::string> GptqArgs(const std::string& out, const std::string& calib) {
  std::ofstream(calib, std::ios::binary) << ReadFile(nibble_test::SharedData("prose-calib.txt")).substr(0, 60000);
  return {"quantize", "--model_dir", nibble_test::EmbeddedModel(), "--output_dir", out, "--quant_algo", "gptq",
          "--dataset", calib, "--num_calib_data", "16", "--seq_len", "128", "--threads", "1"};
}

TEST(CancelCli, CtrlCDuringQuantizeExits130WithNoOutput) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  fs::create_directory(tmp.sub("work"));
  const std::string out = tmp.sub("work/out"), log = tmp.sub("log.txt");
  const pid_t pid = StartNibble(GptqArgs(out, tmp.sub("calib.txt")), log);
  ASSERT_TRUE(WaitForOutput(pid, log, "gptq layers 1/6")) << ReadFile(log);
  kill(pid, SIGINT);
  EXPECT_EQ(WaitExit(pid), 130) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("nibble: cancelled: quantize at "), std::string::npos) << text;
  EXPECT_NE(text.find("nothing was written to " + out + " (SIGINT)"), std::string::npos) << text;
  EXPECT_EQ(text.find("gptq layers 6/6"), std::string::npos) << "not stopped before the last layer:\n" << text;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(Listing(tmp.sub("work")), std::vector<std::string>{}) << "a staging directory was left";
}

TEST(CancelCli, SigtermDuringPerplexityExits143) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  nibble_test::TempDir tmp;
  const std::string log = tmp.sub("log.txt");
  const pid_t pid = StartNibble({"perplexity", "--model", nibble_test::EmbeddedModel(), "--text",
                                 nibble_test::SharedData("prose-val.txt"), "--seq_len", "256", "--threads", "1"},
                                log);
  // Printed once the model is loaded, after the handler is installed.
  ASSERT_TRUE(WaitForOutput(pid, log, "KV cache:")) << ReadFile(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // into the windows
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid), 143) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("nibble: cancelled: "), std::string::npos) << text;
  EXPECT_NE(text.find("(SIGTERM)"), std::string::npos) << text;
  EXPECT_EQ(text.find("perplexity: "), std::string::npos) << "finished instead of stopping:\n" << text;
}

}  // namespace
