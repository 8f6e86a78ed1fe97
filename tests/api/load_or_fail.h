// Loading a model in the API tests: a failed load is a test failure naming the error, and the
// test goes on with nullptr (callers ASSERT on it).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nibble/model.h>

namespace nibble_test {

inline std::unique_ptr<nibble::Model> LoadOrFail(const std::string& dir, const nibble::LoadOptions& options = {}) {
  auto m = nibble::Model::Load(dir, options);
  if (!m.ok()) {
    ADD_FAILURE() << dir << ": " << m.error().message;
    return nullptr;
  }
  return std::move(m).value();
}

}  // namespace nibble_test
