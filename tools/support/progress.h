// Progress of long work on stderr: a bar on a terminal, plain lines in logs (pipes, CI), both
// with an ETA from EtaEstimator, the one rule every progress display here uses. The work's units
// and counts come from the library's progress callbacks (QuantizeRequest::progress, ...).
// Header-only, std + POSIX isatty.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace nibble {

/// Remaining time from a moving rate: seconds per unit of work averaged with weights that decay
/// exponentially with the work done since (by e per `window` units), so the estimate follows the
/// recent rate (a machine that got busier, layers slower than the first) and does not depend on
/// how often it is updated. Before any unit is done the rate is unknown.
class EtaEstimator {
 public:
  explicit EtaEstimator(double window) : window_(std::max(window, 1e-9)) {}

  /// `done` units finished `seconds` after the start. A call without new units changes nothing
  /// (the time until the next unit finishes is counted with that unit).
  void Update(double done, double seconds) {
    const double dd = done - done_, dt = seconds - seconds_;
    if (!(dd > 0)) return;
    const double keep = std::exp(-dd / window_);
    work_ = work_ * keep + dd;
    time_ = time_ * keep + std::max(dt, 0.0);
    done_ = done;
    seconds_ = seconds;
  }
  bool known() const { return work_ > 0; }
  double seconds_per_unit() const { return known() ? time_ / work_ : 0.0; }
  /// Seconds until `total` units are done at the moving rate (0 while the rate is unknown).
  double Remaining(double total) const { return std::max(total - done_, 0.0) * seconds_per_unit(); }

 private:
  double window_;
  double done_ = 0, seconds_ = 0;  // at the last update
  double work_ = 0, time_ = 0;     // decayed sums of units and of their seconds
};

/// The EtaEstimator window for `total` units of work: the last tenth of it weighs most.
inline double EtaWindow(int64_t total) { return std::max(1.0, static_cast<double>(total) / 10.0); }

/// "ETA 12.3 s" or "ETA ?" while the rate is unknown.
inline std::string EtaText(const EtaEstimator& eta, int64_t total) {
  if (!eta.known()) return "ETA ?";
  char buf[48];
  std::snprintf(buf, sizeof buf, "ETA %.1f s", eta.Remaining(static_cast<double>(total)));
  return buf;
}

class ProgressBar {
 public:
  /// `label` prefixes the bar; `total` units of work. On a terminal: a bar redrawn at most ~10
  /// times a second, from 1 s on. Elsewhere, when `log_lines`: one plain line "LABEL 3/60, 12.1 s
  /// elapsed, ETA 24.2 s" at most every 10 s (nothing for shorter work). `enabled` false: silent.
  ProgressBar(std::string label, int64_t total, bool enabled = true, bool log_lines = true)
      : label_(std::move(label)), total_(total), tty_(::isatty(2) != 0), enabled_(enabled && (tty_ || log_lines)),
        eta_(EtaWindow(total)), start_(std::chrono::steady_clock::now()), last_(start_) {}
  ~ProgressBar() { Finish(); }

  /// Reports `done` units finished.
  void Update(int64_t done) {
    if (!enabled_ || total_ <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    eta_.Update(static_cast<double>(done), elapsed);
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!tty_) {
      if (since < 10.0) return;
      last_ = now;
      std::fprintf(stderr, "%s %lld/%lld, %.1f s elapsed, %s\n", label_.c_str(), static_cast<long long>(done),
                   static_cast<long long>(total_), elapsed, EtaText(eta_, total_).c_str());
      return;
    }
    if (done < total_ && (elapsed < 1.0 || (drawn_ && since < 0.1))) return;
    last_ = now;
    const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
    const int width = 30, filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld  %.1fs elapsed, %s ", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                 elapsed, EtaText(eta_, total_).c_str());
    drawn_ = true;
  }
  /// Ends the bar's line (before other output, and at the end).
  void Finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  std::string label_;
  int64_t total_;
  bool tty_, enabled_;
  bool drawn_ = false;
  EtaEstimator eta_;
  std::chrono::steady_clock::time_point start_, last_;
};

/// Per-stage progress of a job done layer by layer (QuantizeRequest::on_stage): "LABEL layer 3/80
/// quantize, 12.1 s elapsed, ETA 24.2 s, RSS 3.10 GB" as each stage of a layer starts, the ETA by
/// the EtaEstimator rule over finished layers. On a terminal one line redrawn in place (\r),
/// elsewhere one plain line per stage.
class StageProgress {
 public:
  explicit StageProgress(std::string label)
      : label_(std::move(label)), tty_(::isatty(2) != 0), start_(std::chrono::steady_clock::now()) {}
  ~StageProgress() { Finish(); }
  void Update(int64_t layer, int64_t layers, int64_t done, const std::string& stage, int64_t rss_anon_bytes) {
    if (layers <= 0) return;
    if (!started_) eta_ = EtaEstimator(EtaWindow(layers));
    started_ = true;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    eta_.Update(static_cast<double>(done), el);
    char rss[32] = "?";
    if (rss_anon_bytes >= 1000000000) std::snprintf(rss, sizeof rss, "%.2f GB", static_cast<double>(rss_anon_bytes) / 1e9);
    else if (rss_anon_bytes >= 0) std::snprintf(rss, sizeof rss, "%.0f MB", static_cast<double>(rss_anon_bytes) / 1e6);
    char line[256];
    std::snprintf(line, sizeof line, "%s layer %lld/%lld %s, %.1f s elapsed, %s, RSS %s", label_.c_str(),
                  static_cast<long long>(layer), static_cast<long long>(layers), stage.c_str(), el,
                  EtaText(eta_, layers).c_str(), rss);
    const std::string text = line;
    if (!tty_) {
      std::fprintf(stderr, "%s\n", text.c_str());
      return;
    }
    const size_t pad = width_ > text.size() ? width_ - text.size() : 0;
    std::fprintf(stderr, "\r%s%s", text.c_str(), std::string(pad, ' ').c_str());
    std::fflush(stderr);
    width_ = text.size();
  }
  /// Ends the terminal line (before other output, and at the end).
  void Finish() {
    if (tty_ && width_ > 0) std::fputc('\n', stderr);
    width_ = 0;
  }

 private:
  std::string label_;
  bool tty_;
  size_t width_ = 0;  // of the line drawn last on the terminal
  EtaEstimator eta_{1.0};
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
};

/// Per-layer log lines of the calibrated algorithms (QuantizeRequest::on_layer) when stderr is
/// not a terminal, where their ProgressBar draws nothing: "LABEL 3/6, 12.1 s elapsed, ETA 24.2 s",
/// the ETA by the same EtaEstimator rule. A no-op on a terminal.
class LayerLog {
 public:
  explicit LayerLog(std::string label) : label_(std::move(label)), start_(std::chrono::steady_clock::now()) {}
  void operator()(int64_t layer, int64_t layers) {
    if (::isatty(2) || layers <= 0) return;
    if (!started_) eta_ = EtaEstimator(EtaWindow(layers));
    started_ = true;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    eta_.Update(static_cast<double>(layer), el);
    std::fprintf(stderr, "%s %lld/%lld, %.1f s elapsed, %s\n", label_.c_str(), static_cast<long long>(layer),
                 static_cast<long long>(layers), el, EtaText(eta_, layers).c_str());
  }

 private:
  std::string label_;
  EtaEstimator eta_{1.0};
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace nibble
