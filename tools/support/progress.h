// A progress bar with ETA on stderr for work that runs longer than a second; silent when stderr
// is not a terminal (CI logs, pipes), where LogLine prints one plain line per long step instead.
// Header-only, std + POSIX isatty.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace nibble {

class ProgressBar {
 public:
  /// `label` prefixes the bar; `total` units of work. Disabled when stderr is not a TTY or
  /// `enabled` is false.
  ProgressBar(std::string label, int64_t total, bool enabled = true)
      : label_(std::move(label)), total_(total), enabled_(enabled && ::isatty(2)),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { Finish(); }

  /// Reports `done` units finished; redraws at most ~10 times a second, only after 1 s.
  void Update(int64_t done) {
    if (!enabled_ || total_ <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (done < total_ && (elapsed < 1.0 || std::chrono::duration<double>(now - last_).count() < 0.1)) return;
    last_ = now;
    const double frac = static_cast<double>(done) / static_cast<double>(total_);
    const int width = 30, filled = static_cast<int>(frac * width);
    const double eta = done > 0 ? elapsed * (1.0 / frac - 1.0) : 0.0;
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld  %.1fs elapsed, ETA %.1fs ", label_.c_str(),
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), elapsed, eta);
    drawn_ = true;
  }
  void Finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_{};
};

/// When stderr is not a terminal: one line "LABEL 3/6, 12.1 s elapsed, ETA 24.2 s" for `done` of
/// `total` steps since `start` (where a ProgressBar is silent). A no-op on a terminal.
inline void LogLine(const std::string& label, int64_t done, int64_t total, std::chrono::steady_clock::time_point start) {
  if (::isatty(2) || total <= 0) return;
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "%s %lld/%lld, %.1f s elapsed, ETA %.1f s\n", label.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), el, done > 0 ? el * static_cast<double>(total - done) / static_cast<double>(done) : 0.0);
}

}  // namespace nibble
