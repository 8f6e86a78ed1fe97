// Running the built `nibble` CLI from a test, as a user runs it: through the shell and waited for
// (RunNibble), or as a child process the test signals, kills or polls (SpawnNibble).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/sha256.h"
#include "test_paths.h"

namespace nibble_test {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;     // stdout + stderr
};

inline std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A shell command line; its stdout (and whatever it redirects there) and exit code.
inline RunResult RunCommand(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline RunResult RunNibble(const std::string& args, bool merge_stderr = true) {
  return RunCommand(Quote(NibbleBinary()) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// How SpawnNibble starts the child.
struct SpawnOptions {
  std::string log;    // stdout and stderr go to this file; "" = /dev/null
  std::string stdin_path;  // a file for stdin; "" = the test's own
  std::vector<std::pair<std::string, std::string>> env;  // set in the child only
  rlim_t max_file_size = RLIM_INFINITY;  // RLIMIT_FSIZE: larger writes fail with EFBIG (SIGXFSZ ignored)
};

// Starts `nibble ARGS` as a child process; returns its pid (WaitExit reaps it). SIGINT and SIGTERM
// get their default actions as in a shell's foreground job: a test runner started in the
// background has SIGINT ignored, and nibble leaves an ignored signal ignored.
inline pid_t SpawnNibble(const std::vector<std::string>& args, const SpawnOptions& o = {}) {
  std::vector<std::string> argv_s = {NibbleBinary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid != 0) return pid;
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  for (const auto& [k, v] : o.env) setenv(k.c_str(), v.c_str(), 1);
  if (o.max_file_size != RLIM_INFINITY) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit r{o.max_file_size, o.max_file_size};
    setrlimit(RLIMIT_FSIZE, &r);
  }
  const int fd = o.log.empty() ? open("/dev/null", O_WRONLY) : open(o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  if (!o.stdin_path.empty()) dup2(open(o.stdin_path.c_str(), O_RDONLY), 0);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

// The same with stdout and stderr to `log`.
inline pid_t SpawnNibble(const std::vector<std::string>& args, const std::string& log) {
  SpawnOptions o;
  o.log = log;
  return SpawnNibble(args, o);
}

// The child's exit code, or -signal when a signal ended it.
inline int WaitExit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

// Polls `log` until it holds `text` (true) or the child ended / `timeout` passed (false).
inline bool WaitForOutput(pid_t pid, const std::string& log, const std::string& text,
                          std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (ReadFile(log).find(text) != std::string::npos) return true;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// File name -> SHA-256 of every file in `dir` (an output compared byte for byte with another).
inline std::map<std::string, std::string> HashDir(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out[e.path().filename().string()] = nibble::Sha256Hex(ReadFile(e.path().string()));
  return out;
}

// The value of "perplexity: X" in nibble's output; -1 when there is none.
inline double ParsePerplexity(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("perplexity: ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

}  // namespace nibble_test
