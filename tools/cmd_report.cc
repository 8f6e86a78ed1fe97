// `nibble report FILE.json [--plot out.png]`: a quantization report (from `nibble quantize
// --report`) as a human summary, and optionally a PNG of the per-linear errors.
#include <cstdio>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/report.h"

namespace nibble_cli {

namespace {
struct ReportArgs {
  std::string file, plot;
};
}  // namespace

Runner RegisterReport(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Summarize a quantize --report JSON file; --plot draws the per-linear errors");
  cmd->add_option("file", a->file, "Report JSON written by nibble quantize --report")->required();
  cmd->add_option("--plot", a->plot, "Write a PNG: per-linear relative output error RTN vs AWQ (AWQ reports) or weight error (RTN reports)");
  return [a]() {
    auto s = nibble::SummarizeQuantizeReport(a->file);
    if (!s.ok()) return Fail(s.error().message);
    std::fputs(s->c_str(), stdout);
    if (!a->plot.empty()) {
      nibble::Status st = nibble::PlotQuantizeReport(a->file, a->plot);
      if (!st.ok()) return Fail(st.error().message);
      std::printf("wrote %s\n", a->plot.c_str());
    }
    return 0;
  };
}

}  // namespace nibble_cli
