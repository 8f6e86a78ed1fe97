// The CLI's handling of `nibble quantize --report` files (the JSON is QuantizeSummary::report_json):
// writing it atomically, summarising it, plotting it.
#pragma once

#include <string>

#include <nibble/error.h>

namespace nibble {

/// Writes `bytes` to `path` atomically (a temporary file beside it, fsync, rename): a reader never
/// sees a half-written file, and a failed write leaves any previous file at `path` as it was.
/// Errors name the path and the OS reason (missing directory, permission, full disk).
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

/// Human summary of a report (AWQ per layer: chosen ratio, loss before / after, per-linear output
/// errors; every report: per-linear relative weight error, the linears kept in float).
/// Errors: unreadable file, not a nibble report.
Result<std::string> SummarizeQuantizeReport(const std::string& report_path);

/// Draws into a PNG (cairo, log scale, one marker per linear) per-linear relative output error RTN
/// vs AWQ of an AWQ report, or per-linear relative weight error of an RTN report.
/// Errors: unreadable / malformed report, no quantized linears, unwritable PNG, a build without
/// cairo ("built without cairo: PNG plots are unavailable").
Status PlotQuantizeReport(const std::string& report_path, const std::string& png_path);

}  // namespace nibble
