// Tokens → statement tree. The constructs are those of Jinja that chat templates use: output,
// if / elif / else, for (tuple targets, `if` filter, else), set (name, tuple, namespace
// attribute, block), macro, break / continue, and Transformers' {% generation %} marker.
// Expressions follow Jinja's precedence: ternary, or, and, not, comparisons and `in`, + -, ~,
// * / // %, **, unary minus, then postfix attribute / subscript / slice / call, filters and
// `is` tests.
#pragma once

#include <string_view>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace nibble::chat {

/// Nesting (statements and expressions together) the parser accepts; deeper is an error, so
/// neither the parser nor the renderer can exhaust the stack.
inline constexpr int kMaxNesting = 128;

/// Throws JinjaError naming what it met and where: an unknown or unsupported tag, an unclosed
/// block (with the line it opened on), a stray end tag, an unexpected token.
Body Parse(std::string_view source, const LexOptions& options = LexOptions());

}  // namespace nibble::chat
