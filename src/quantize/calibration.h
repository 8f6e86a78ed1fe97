// Calibration data for activation-aware quantization (AWQ): texts from a plain-text file or a
// JSONL file, tokenized, concatenated and cut into `num_chunks` chunks of `seq_len` tokens.
//
// Convention (matches the project's reference numbers, "the first N chunks of 512 tokens of
// [BOS] + encode(prose-calib.txt)"): a plain-text file is ONE text; a JSONL file holds one text per
// line (field "text"). Each text is encoded with the tokenizer's default call (BOS prepended when
// the tokenizer adds one), the encodings are concatenated in file order, and the stream is cut
// into consecutive non-overlapping chunks of seq_len tokens (a document longer than seq_len spans
// several chunks; the remainder after the last full chunk is dropped). seed 0 (default) takes the
// first num_chunks chunks in order; any other seed takes num_chunks distinct chunks chosen by a
// Fisher-Yates shuffle driven by std::mt19937_64(seed) with our own index draw (portable across
// standard libraries). Fewer available chunks than asked is a warning with the real count, not an
// error (at least one full chunk is required).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

/// Reads calibration texts. A file whose name ends in ".jsonl" (or ".json" holding one object
/// per line) is parsed line by line: each non-empty line must be a JSON object with a string
/// "text"; any other file is one UTF-8 text. Errors: unreadable file, a JSONL line that is not
/// JSON or has no string "text" (names file and line number), no non-empty text.
Result<std::vector<std::string>> ReadCalibrationTexts(const std::string& path);

struct CalibrationData {
  int64_t seq_len = 0;
  int64_t num_chunks = 0;          // chunks actually taken (<= asked)
  int64_t available_chunks = 0;    // full chunks in the token stream
  int64_t total_tokens = 0;        // tokens in the concatenated stream
  std::vector<int32_t> tokens;     // [num_chunks, seq_len] row-major
  std::vector<int64_t> chunk_index;  // which chunk of the stream each row is
  std::vector<std::string> warnings;
};

/// The calibration settings an export records (quantization_config "calibration"), so two
/// exports of one model can be told apart: the dataset's file name and SHA-256, the chunks taken
/// (num_calib_data), seq_len, seed and the propagation ("fp" | "quantized").
/// Errors: the dataset cannot be read.
Result<nlohmann::ordered_json> CalibrationRecord(const std::string& dataset, const CalibrationData& data, uint64_t seed,
                                                 const std::string& propagation);

/// Tokenizes and chunks `texts` as described above. Errors: seq_len < 1, num_chunks < 1, a text
/// that is not UTF-8, fewer tokens than one chunk (names the counts).
Result<CalibrationData> BuildCalibrationData(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
                                             int64_t num_chunks, int64_t seq_len, uint64_t seed);

}  // namespace nibble
