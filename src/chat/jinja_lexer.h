// Jinja template text → tokens. Text between tags is one token; comments are dropped. Whitespace
// control is applied here: `{%-` / `-%}` (and the same on `{{ }}` / `{# #}`) strip the
// whitespace next to the tag, and the environment Transformers renders chat templates in sets
// trim_blocks (the first newline after a block or comment tag goes) and lstrip_blocks (spaces
// and tabs from the start of a line up to a block or comment tag go). One trailing newline of
// the template is dropped (keep_trailing_newline=False).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_value.h"

namespace nibble::chat {

enum class TokenKind {
  kText,        // literal text outside tags
  kExprOpen,    // {{
  kExprClose,   // }}
  kBlockOpen,   // {%
  kBlockClose,  // %}
  kName,        // identifier or keyword
  kString,      // string literal (text holds the unescaped value)
  kInt,
  kFloat,
  kOperator,    // punctuation and operators: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } . , : |
  kEnd,
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

/// Throws JinjaError (with the position) on an unclosed tag or comment, an unterminated string
/// or a character no token starts with.
std::vector<Token> Lex(std::string_view source, const LexOptions& options = LexOptions());

}  // namespace nibble::chat
