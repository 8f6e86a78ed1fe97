// Running the built `nibble` CLI from a test, as a user runs it.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

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

// The value of "perplexity: X" in nibble's output; -1 when there is none.
inline double ParsePerplexity(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("perplexity: ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

}  // namespace nibble_test
