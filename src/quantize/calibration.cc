#include "quantize/calibration.h"

#include <filesystem>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "base/strings.h"
#include "io/file.h"

namespace nibble {

namespace {
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Result<std::vector<std::string>> ReadCalibrationTexts(const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(std::string data, ReadFileToString(path));
  std::vector<std::string> texts;
  if (EndsWith(path, ".jsonl")) {
    std::istringstream in(data);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        return MakeError(path, ":", line_no, ": not a JSON value (", PrintableBytes(e.what()), ")");
      }
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
        return MakeError(path, ":", line_no, ": expected a JSON object with a string field \"text\"");
      std::string t = j["text"].get<std::string>();
      if (!t.empty()) texts.push_back(std::move(t));
    }
  } else if (!data.empty()) {
    texts.push_back(std::move(data));
  }
  if (texts.empty()) return MakeError(path, ": no calibration text (empty file or no non-empty \"text\")");
  return texts;
}

Result<CalibrationData> BuildCalibrationData(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
                                             int64_t num_chunks, int64_t seq_len, uint64_t seed) {
  if (seq_len < 1) return MakeError("--seq_len ", seq_len, " must be at least 1");
  if (num_chunks < 1) return MakeError("--num_calib_data ", num_chunks, " must be at least 1");
  std::vector<int32_t> stream;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tokenizer.Encode(texts[i]);
    if (!ids.ok()) return ids.error().WithContext("calibration text " + std::to_string(i + 1));
    stream.insert(stream.end(), ids->begin(), ids->end());
  }
  CalibrationData d;
  d.seq_len = seq_len;
  d.total_tokens = static_cast<int64_t>(stream.size());
  d.available_chunks = d.total_tokens / seq_len;
  if (d.available_chunks == 0)
    return MakeErrorCode(ErrorCode::kCorruptInput, "calibration data has ", d.total_tokens,
                         " tokens, fewer than one chunk of --seq_len ", seq_len, " (give more text or a smaller --seq_len)");
  std::vector<int64_t> order(static_cast<size_t>(d.available_chunks));
  for (int64_t i = 0; i < d.available_chunks; ++i) order[i] = i;
  if (seed != 0) {
    std::mt19937_64 rng(seed);
    for (int64_t i = d.available_chunks - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order[i], order[j]);
    }
  }
  d.num_chunks = std::min(num_chunks, d.available_chunks);
  if (d.num_chunks < num_chunks)
    d.warnings.push_back("calibration data has " + std::to_string(d.total_tokens) + " tokens: " +
                         std::to_string(d.num_chunks) + " chunks of " + std::to_string(seq_len) + " tokens instead of the " +
                         std::to_string(num_chunks) + " asked for (" + std::to_string(d.num_chunks * seq_len) +
                         " calibration tokens)");
  for (int64_t i = 0; i < d.num_chunks; ++i) {
    d.chunk_index.push_back(order[i]);
    d.tokens.insert(d.tokens.end(), stream.begin() + order[i] * seq_len, stream.begin() + (order[i] + 1) * seq_len);
  }
  return d;
}

Result<nlohmann::ordered_json> CalibrationRecord(const std::string& dataset, const CalibrationData& data, uint64_t seed,
                                                 const std::string& propagation) {
  NIBBLE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(dataset));
  nlohmann::ordered_json j;
  j["dataset"] = std::filesystem::path(dataset).filename().string();
  j["dataset_sha256"] = Sha256Hex(bytes);
  j["num_calib_data"] = data.num_chunks;
  j["seq_len"] = data.seq_len;
  j["seed"] = seed;
  j["propagation"] = propagation;
  return j;
}

}  // namespace nibble
