// Renders a parsed template: statements write into one output string, expressions evaluate to
// Values. Scoping follows Jinja: a for loop body and a macro call have their own scope (a `set`
// inside does not leak out; namespace attributes do), if blocks do not.
#pragma once

#include <cstdint>
#include <string>

#include "chat/jinja_ast.h"

namespace nibble::chat {

/// Bounds on one render, so that no template text can hang or exhaust memory.
struct RenderLimits {
  int64_t max_steps = 20'000'000;        // statements + expressions evaluated
  size_t max_output = size_t{64} << 20;  // bytes of rendered text
  int max_call_depth = 32;               // nested macro calls
};

/// Renders `body` with `globals` as the outermost variables (builtins such as range,
/// namespace and raise_exception are added below them). Throws JinjaError.
std::string RenderTemplate(const Body& body, const ValueDict& globals, const RenderLimits& limits = RenderLimits());

}  // namespace nibble::chat
