// Public API: the KV memory model (ctx_size default, KV bytes, the --max_memory budget).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include <nibble/session.h>

#include "api/model_impl.h"
#include "base/memory.h"

namespace nibble {

int64_t DefaultContextSize(const Model& model) {
  return std::min<int64_t>(model.info().max_position_embeddings, 8192);
}

int64_t KvCacheBytes(const Model& model, int64_t context) {
  return KvBytes(ModelAccess::llama(model).config(), context, model.info().kv_dtype == KvDtype::kBf16);
}

int64_t DefaultMaxMemory() { return DefaultMemoryLimit(); }  // MemAvailable, lowered to RLIMIT_AS's room

Result<int64_t> ParseMemorySize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  std::string suffix = text.substr(digits);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const std::pair<const char*, double> units[] = {{"", 1},      {"b", 1},          {"kb", 1e3},        {"mb", 1e6},
                                                  {"gb", 1e9},  {"tb", 1e12},      {"kib", 1024.0},    {"mib", 1048576.0},
                                                  {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  double number = 0;
  try {
    size_t used = 0;
    number = digits == 0 ? -1 : std::stod(text.substr(0, digits), &used);
    if (used != digits) number = -1;
  } catch (const std::exception&) {
    number = -1;
  }
  for (const auto& [name, scale] : units)
    if (suffix == name && number >= 0 && number * scale < 9.2e18) return static_cast<int64_t>(std::llround(number * scale));
  return MakeError("memory size \"", text, "\" is not a number of bytes with an optional unit (KB MB GB TB KiB MiB GiB TiB), "
                   "e.g. 16GB or 512MiB");
}

Status CheckKvMemory(const Model& model, int64_t context, int64_t max_memory) {
  const bool fallback = max_memory == 0;
  const int64_t limit = fallback ? DefaultMaxMemory() : max_memory;
  const int64_t need = KvCacheBytes(model, context);
  if (limit < 0 || need <= limit) return Status::Ok();
  const ModelInfo& i = model.info();
  return MakeErrorCode(ErrorCode::kResourceExhausted, "a KV cache of ", context, " positions (ctx_size; ", KvDtypeName(i.kv_dtype),
                       ", ", i.num_hidden_layers, " layers x ", i.num_key_value_heads, " kv heads x ", i.head_dim,
                       " head_dim) needs ", need, " bytes (", FormatBytes(static_cast<double>(need)), "), more than the ", limit, " bytes (", FormatBytes(static_cast<double>(limit)),
                       ") allowed by ", fallback ? "the default --max_memory (90 % of MemAvailable)" : "--max_memory",
                       ": lower --ctx_size", i.kv_dtype == KvDtype::kFp32 ? " or use --kv_dtype bf16" : "");
}

}  // namespace nibble
