// Running the built `nibble` CLI from a test, as a user runs it.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "test_paths.h"

namespace nibble_test {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;     // stdout + stderr
  std::string stdout_only;
};

inline std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline RunResult RunNibble(const std::string& args, bool merge_stderr = true) {
  const std::string cmd = Quote(NibbleBinary()) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
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

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace nibble_test
