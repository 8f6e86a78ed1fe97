// Paths the tests use: the repository (NIBBLE_SOURCE_DIR), the shared models and data next to it
// (../shared, as laid out for CI; the environment variable NIBBLE_SHARED_DIR points elsewhere),
// and the built CLI. Tests that need a shared model or data file start with NIBBLE_NEEDS_SHARED,
// so without it they skip, saying what is missing, instead of failing.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>

#include <gtest/gtest.h>

namespace nibble_test {

inline std::string SourceDir() { return NIBBLE_SOURCE_DIR; }
inline std::string SharedDir() {
  const char* env = std::getenv("NIBBLE_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(NIBBLE_SOURCE_DIR) + "/../shared";
}
inline std::string SharedModel(const std::string& name) { return SharedDir() + "/models/" + name; }
inline std::string EmbeddedModel() { return SourceDir() + "/models/prose-llama-7m"; }
inline std::string SharedData(const std::string& name) { return SharedDir() + "/data/" + name; }
inline std::string NibbleBinary() { return std::string(NIBBLE_BINARY_DIR) + "/nibble"; }

/// Empty when every path (relative to SharedDir(): "models/stories260K", "data/prose-val.txt")
/// exists, else why a test that needs them cannot run.
inline std::string MissingShared(std::initializer_list<const char*> rel_paths) {
  for (const char* rel : rel_paths) {
    const std::string path = SharedDir() + "/" + rel;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return "needs ../shared/" + std::string(rel) + " (not found at " + path + ")";
  }
  return "";
}

}  // namespace nibble_test

/// Skips the current test, with the reason, unless the shared paths it names exist:
/// NIBBLE_NEEDS_SHARED("models/stories260K", "data/tinyshakespeare.txt");
#define NIBBLE_NEEDS_SHARED(...)                                                             \
  do {                                                                                       \
    const std::string nibble_missing_shared_ = ::nibble_test::MissingShared({__VA_ARGS__}); \
    if (!nibble_missing_shared_.empty()) GTEST_SKIP() << nibble_missing_shared_;            \
  } while (0)
