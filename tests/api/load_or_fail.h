// Shared by the API tests: loading a model (a failed load is a test failure naming the error,
// and the test goes on with nullptr: callers ASSERT on it) and greedy generation options.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nibble/model.h>
#include <nibble/session.h>

namespace nibble_test {

inline std::unique_ptr<nibble::Model> LoadOrFail(const std::string& dir, const nibble::LoadOptions& options = {}) {
  auto m = nibble::Model::Load(dir, options);
  if (!m.ok()) {
    ADD_FAILURE() << dir << ": " << m.error().message;
    return nullptr;
  }
  return std::move(m).value();
}

/// Options of a greedy Generate of `n` tokens after `prompt`.
inline nibble::GenerateOptions GreedyOptions(const std::string& prompt, int64_t n) {
  nibble::GenerateOptions o;
  o.prompt = prompt;
  o.max_new_tokens = n;
  o.sampling.temperature = 0;
  return o;
}

}  // namespace nibble_test
