// A progress bar with ETA on stderr for work that runs longer than a second; when stderr is not a
// terminal (CI logs, pipes) silent, or one plain line per step for long steps (calibrated
// quantization layers). Header-only, std + POSIX isatty.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace nibble {

class ProgressBar {
 public:
  /// `label` prefixes the bar; `total` units of work. Disabled when `enabled` is false, or when
  /// stderr is not a TTY and `log_lines` is false; with `log_lines` a non-TTY stderr gets one line
  /// per Update that advances ("gptq layers 3/6, 12.1 s elapsed, ETA 24.2 s").
  ProgressBar(std::string label, int64_t total, bool enabled = true, bool log_lines = false)
      : label_(std::move(label)), total_(total), tty_(::isatty(2) != 0), enabled_(enabled && (tty_ || log_lines)),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { Finish(); }

  /// Reports `done` units finished; redraws at most ~10 times a second, only after 1 s.
  void Update(int64_t done) {
    if (!enabled_ || total_ <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (!tty_) {
      if (done <= logged_) return;
      logged_ = done;
      std::fprintf(stderr, "%s %lld/%lld, %.1f s elapsed, ETA %.1f s\n", label_.c_str(), static_cast<long long>(done),
                   static_cast<long long>(total_), elapsed,
                   done > 0 ? elapsed * static_cast<double>(total_ - done) / static_cast<double>(done) : 0.0);
      return;
    }
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
  bool tty_, enabled_;
  bool drawn_ = false;
  int64_t logged_ = 0;
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace nibble
