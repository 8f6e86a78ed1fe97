// AWQ's grid search for one mapping (llm-compressor AWQModifier semantics, SPEC §2.1):
// x_mean[c] = mean |x[:, c]| of the balance layers' input, w_mean[c] = the group-normalised weight
// mean (duo scaling); for each grid candidate s = clamp_min(x^r / (w^(1-r) + 1e-4), 1e-4) (duo) or
// clamp_min(x^r, 1e-4), s /= sqrt(max s · min s), inf/NaN → 1; every quantized balance layer
// W → Q(W·s)/s (Quark RTN of its scheme, scales in the model dtype); the inspected module runs on
// all calibration rows; loss = MSE against its output with the unquantized weights. The first
// candidate with the strictly smallest finite loss wins and is applied: balance columns × s,
// prev_op ÷ s (an RMSNorm weight rounded at once to its stored dtype, since that is what the
// checkpoint holds; or the last len(s) output rows and bias of a prev_op Linear).
// All arithmetic in fp32 with sums in double over fixed blocks: the result does not depend on the
// thread count. A candidate whose RTN scale or a float-stored value would overflow its dtype is
// rejected (never stored as inf); the identity candidate (ratio 0, no duo) is always first.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"
#include "quantize/awq/mappings.h"
#include "quantize/awq/settings.h"
#include "quantize/pipeline.h"

namespace nibble {

/// Rows per chunk of an inspected module's runs (keeps temporaries in cache).
inline constexpr int64_t kAwqInspectChunkRows = 2048;

/// Per-mapping outcome for the report.
struct AwqMappingReport {
  AwqMapping mapping;
  bool skipped = false;
  std::string skip_reason;
  double ratio = 0;        // best grid ratio
  bool duo = false;        // best candidate used duo scaling
  double loss_rtn = 0;     // MSE of the inspected output with plain RTN (identity scales)
  double loss_best = 0;    // MSE with the chosen scales
  int64_t rejected = 0;    // candidates rejected (non-finite loss, overflow)
  int64_t stopped_early = 0;  // candidates dropped once their partial loss exceeded the best so far
  double scale_min = 0, scale_max = 0;  // of the chosen s
};

/// Whether a mapping that inspects one linear with `k` inputs scores its candidates through the
/// Gram matrix (AwqSettings::gram_linear_loss) rather than by running the candidate linear over
/// the `rows` calibration rows. fp32 calibration always takes the Gram matrix (2·N·K² fp32 flops
/// per candidate, exact to rounding); a 16-bit calibration dtype runs the candidate forward in
/// that dtype, as llm-compressor scores it, wherever its 2·rows·N·K flops (bf16 GEMMs at twice
/// the sgemm's rate) cost less, with the early stop of losing candidates on top.
bool AwqGramLoss(const AwqSettings& st, CalibDType calib, int64_t rows, int64_t k);

/// What the search of mapping `r` reads of the layer run to SearchStop(r) (LayerRunner::Capture):
/// the mean |x| of the balance layers' input, and the Gram matrix of the inspected linear's input
/// (AwqGramLoss over `rows`) or else all rows of the inspected module's input.
CaptureRequest SearchNeeds(const ResolvedMapping& r, const AwqSettings& st, const CalibLayer& L, int64_t rows);

/// Searches the grid for mapping `r` on the captures `a` (Capture with SearchNeeds) and
/// applies the best scales to L. `lin`: L's calibration linears (MakeLinears); each candidate's are
/// swapped in for its loss and back out, and on return those of RescaledLinears(r) are stale.
/// Errors: no candidate with a finite loss (names the layer).
Result<AwqMappingReport> SearchAndApply(const LayerRunner& runner, const ResolvedMapping& r, CalibLayer& L,
                                        CalibLinears& lin, const CapturedRows& a, const AwqSettings& st);

}  // namespace nibble
