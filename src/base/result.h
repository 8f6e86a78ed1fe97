// Error values for internal code: the public Result/Status/Error types plus the early-return
// macros used throughout the layers.
#pragma once

#include <nibble/error.h>

/// Returns early from the enclosing function with the error of a Status/Result expression.
#define NIBBLE_RETURN_IF_ERROR(expr)              \
  do {                                            \
    auto nibble_status_ = (expr);                 \
    if (!nibble_status_.ok()) return nibble_status_.error(); \
  } while (0)

#define NIBBLE_CONCAT_INNER_(a, b) a##b
#define NIBBLE_CONCAT_(a, b) NIBBLE_CONCAT_INNER_(a, b)
/// `NIBBLE_ASSIGN_OR_RETURN(auto x, Foo());` — binds the value or returns the error.
#define NIBBLE_ASSIGN_OR_RETURN(decl, expr) \
  NIBBLE_ASSIGN_OR_RETURN_IMPL_(NIBBLE_CONCAT_(nibble_result_, __LINE__), decl, expr)
#define NIBBLE_ASSIGN_OR_RETURN_IMPL_(tmp, decl, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.error();                   \
  decl = std::move(tmp).value()
