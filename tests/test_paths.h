// Paths the tests use: the repository (NIBBLE_SOURCE_DIR), the shared models and data next to it
// (../shared, as laid out for CI), and the built CLI.
#pragma once

#include <string>

namespace nibble_test {

inline std::string SourceDir() { return NIBBLE_SOURCE_DIR; }
inline std::string SharedDir() { return std::string(NIBBLE_SOURCE_DIR) + "/../shared"; }
inline std::string SharedModel(const std::string& name) { return SharedDir() + "/models/" + name; }
inline std::string EmbeddedModel() { return SourceDir() + "/models/prose-llama-7m"; }
inline std::string SharedData(const std::string& name) { return SharedDir() + "/data/" + name; }
inline std::string NibbleBinary() { return std::string(NIBBLE_BINARY_DIR) + "/nibble"; }

}  // namespace nibble_test
