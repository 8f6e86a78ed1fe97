// `nibble report FILE.json [FILE.json ...] [--plot out.png]`: quantization reports (from `nibble
// quantize --report`) as human summaries, and optionally one PNG of the per-linear errors of all.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/report.h"

namespace nibble_cli {

namespace {
struct ReportArgs {
  std::vector<std::string> files;
  std::string plot;
};
}  // namespace

Runner RegisterReport(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Summarize a quantize --report JSON file; --plot draws the per-linear errors");
  cmd->add_option("files", a->files, "Report JSON files written by nibble quantize --report")->required()->expected(1, -1);
  cmd->add_option("--plot", a->plot,
                  "Write a PNG: per-linear relative output error of RTN and each report's method (awq / gptq reports), "
                  "or the weight error of one RTN report");
  return [a]() {
    for (size_t i = 0; i < a->files.size(); ++i) {
      auto s = nibble::SummarizeQuantizeReport(a->files[i]);
      if (!s.ok()) return Fail(s.error().message);
      std::fputs(((i ? "\n" : "") + *s).c_str(), stdout);
    }
    if (!a->plot.empty()) {
      nibble::Status st = nibble::PlotQuantizeReports(a->files, a->plot);
      if (!st.ok()) return Fail(st.error().message);
      std::printf("wrote %s\n", a->plot.c_str());
    }
    return 0;
  };
}

}  // namespace nibble_cli
