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

/// Human summary of a report (per layer: chosen ratio, loss before / after, per-linear errors).
/// Errors: unreadable file, not a nibble report.
Result<std::string> SummarizeQuantizeReport(const std::string& report_path);

/// Draws per-linear relative output error (RTN vs AWQ, log scale) of a report into a PNG (cairo).
/// Errors: unreadable / malformed report, a report without AWQ layers, unwritable PNG, a build
/// without cairo ("built without cairo: PNG plots are unavailable").
Status PlotQuantizeReport(const std::string& report_path, const std::string& png_path);

}  // namespace nibble
