// JSON reading with errors that name the file (nlohmann-json underneath).
// Duplicate keys in any object are an error (nlohmann would silently keep the last one).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace nibble {

/// Deepest nesting of arrays/objects accepted (real configs and headers use < 10 levels).
inline constexpr int kMaxJsonDepth = 256;

/// Parses `text`; `what` (e.g. a file path) prefixes errors. Errors: not valid JSON / not UTF-8
/// (with nlohmann's byte position), duplicate key, nesting deeper than kMaxJsonDepth.
Result<nlohmann::json> ParseJsonText(const std::string& text, const std::string& what);

/// Reads and parses the file at `path`. Errors: unreadable file, plus ParseJsonText's.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

/// A double as JSON, exactly: finite values as numbers (written with round-trip precision),
/// NaN and infinities as "nan" / "inf" / "-inf"; and back (throws nlohmann's type_error on
/// anything else). For state a later process must restore bit for bit (quantize --resume).
nlohmann::ordered_json DoubleJson(double v);
double DoubleFromJson(const nlohmann::ordered_json& j);

}  // namespace nibble
