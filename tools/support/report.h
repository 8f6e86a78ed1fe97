// The CLI's handling of `nibble quantize --report` files (the JSON is QuantizeSummary::report_json):
// writing it atomically, summarising it, plotting it.
#pragma once

#include <string>
#include <vector>

#include <nibble/error.h>

namespace nibble {

/// A quantization method's display name: "awq" -> "AWQ", "awq,gptq" -> "AWQ+GPTQ".
std::string MethodLabel(const std::string& algo);

/// Writes `bytes` to `path` atomically (a temporary file beside it, fsync, rename): a reader never
/// sees a half-written file, and a failed write leaves any previous file at `path` as it was.
/// Errors name the path and the OS reason (missing directory, permission, full disk).
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

/// Human summary of a report (AWQ per layer: chosen ratio, loss before / after, per-linear output
/// errors; every report: per-linear relative weight error, the linears kept in float).
/// Errors: unreadable file, not a nibble report.
Result<std::string> SummarizeQuantizeReport(const std::string& report_path);

/// Draws into a PNG (cairo, log scale, one marker per linear and series) the per-linear relative
/// output error of RTN and of each calibrated report's method (AWQ, GPTQ, AWQ+GPTQ: one series
/// per report, on the first report's linears), or the per-linear relative weight error of one
/// RTN report. Errors: unreadable / malformed report, an RTN report among several, more than 4
/// reports, no quantized linears, unwritable PNG, a build without cairo ("built without cairo:
/// PNG plots are unavailable").
Status PlotQuantizeReports(const std::vector<std::string>& report_paths, const std::string& png_path);

}  // namespace nibble
