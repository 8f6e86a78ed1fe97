// Jinja lexer: tags found by their openers, tokens inside tags, whitespace control on the text
// (`{%+` keeps the indentation lstrip_blocks would remove, as in Jinja).
#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace nibble::chat {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& o) : src_(src), opt_(o) {
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-'
    while (pos < src_.size()) {
      const size_t open = FindOpener(pos);
      size_t text_end = open;
      const bool has_tag = open < src_.size();
      const char kind = has_tag ? src_[open + 1] : 0;
      if (has_tag && open + 2 < src_.size() && src_[open + 2] == '-') {
        while (text_end > pos && IsSpace(src_[text_end - 1])) --text_end;
      } else if (has_tag && kind != '{' && opt_.lstrip_blocks && !(open + 2 < src_.size() && src_[open + 2] == '+')) {
        size_t q = text_end;
        while (q > pos && (src_[q - 1] == ' ' || src_[q - 1] == '\t')) --q;
        if (q == 0 || src_[q - 1] == '\n') text_end = q;
      }
      size_t text_begin = pos;
      if (strip_next)
        while (text_begin < text_end && IsSpace(src_[text_begin])) ++text_begin;
      if (text_begin < text_end) Emit(TokenKind::kText, std::string(src_.substr(text_begin, text_end - text_begin)), text_begin);
      if (!has_tag) break;
      pos = kind == '#' ? SkipComment(open, &strip_next) : LexTag(open, kind, &strip_next);
    }
    Emit(TokenKind::kEnd, "", src_.size());
    return std::move(out_);
  }

 private:
  SourcePos PosOf(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return SourcePos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }
  [[noreturn]] void Fail(size_t offset, const std::string& msg) const { throw JinjaError(PosOf(offset), msg); }

  void Emit(TokenKind k, std::string text, size_t offset) {
    Token t;
    t.kind = k;
    t.text = std::move(text);
    t.pos = PosOf(offset);
    out_.push_back(std::move(t));
  }

  size_t FindOpener(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  // After a tag that ends at `end` (one past its closer): trim_blocks drops one newline.
  size_t AfterTag(size_t end, bool block_or_comment, bool strip) const {
    if (!strip && block_or_comment && opt_.trim_blocks && end < src_.size() && src_[end] == '\n') return end + 1;
    return end;
  }

  size_t SkipComment(size_t open, bool* strip_next) {
    const size_t close = src_.find("#}", open + 2);
    if (close == std::string_view::npos) Fail(open, "unclosed comment: '{#' without '#}'");
    *strip_next = close > open + 2 && src_[close - 1] == '-';
    return AfterTag(close + 2, true, *strip_next);
  }

  // Tokens of one {{ ... }} or {% ... %}; returns the offset after the closer.
  size_t LexTag(size_t open, char kind, bool* strip_next) {
    const bool block = kind == '%';
    Emit(block ? TokenKind::kBlockOpen : TokenKind::kExprOpen, block ? "{%" : "{{", open);
    size_t i = open + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    int braces = 0;  // '{' opened inside the tag: '}}' closes a dict there, not the tag
    while (true) {
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (i >= src_.size()) Fail(open, std::string("unclosed tag: '") + (block ? "{%" : "{{") + "' without '" + (block ? "%}" : "}}") + "'");
      const char closer = block ? '%' : '}';
      const bool dash = src_[i] == '-' && i + 2 < src_.size() && src_[i + 1] == closer && src_[i + 2] == '}';
      if (braces == 0 && (dash || (src_[i] == closer && i + 1 < src_.size() && src_[i + 1] == '}'))) {
        const size_t end = i + (dash ? 3 : 2);
        Emit(block ? TokenKind::kBlockClose : TokenKind::kExprClose, block ? "%}" : "}}", i);
        *strip_next = dash;
        return AfterTag(end, block, dash);
      }
      i = LexOne(i, &braces);
    }
  }

  size_t LexOne(size_t i, int* braces) {
    const char c = src_[i];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
      Emit(TokenKind::kName, std::string(src_.substr(i, j - i)), i);
      return j;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return LexNumber(i);
    if (c == '\'' || c == '"') return LexString(i);
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                       "=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "|"};
    for (const char* op : kOps) {
      const std::string_view o(op);
      if (src_.substr(i, o.size()) == o) {
        if (o == "{") ++*braces;
        if (o == "}") *braces = std::max(0, *braces - 1);
        Emit(TokenKind::kOperator, std::string(o), i);
        return i + o.size();
      }
    }
    Fail(i, std::string("unexpected character '") + c + "' in a tag");
  }

  size_t LexNumber(size_t i) {
    size_t j = i;
    while (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) ++j;
    bool is_float = false;
    if (j + 1 < src_.size() && src_[j] == '.' && std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
      is_float = true;
      ++j;
      while (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) ++j;
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        j = k;
        while (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) ++j;
      }
    }
    const std::string text(src_.substr(i, j - i));
    Emit(is_float ? TokenKind::kFloat : TokenKind::kInt, text, i);
    if (is_float) {
      out_.back().float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
      if (errno != 0 || v > static_cast<unsigned long long>(INT64_MAX)) Fail(i, "integer literal " + text + " is out of range");
      out_.back().int_value = static_cast<int64_t>(v);
    }
    return j;
  }

  size_t LexString(size_t i) {
    const char q = src_[i];
    std::string value;
    size_t j = i + 1;
    for (; j < src_.size() && src_[j] != q; ++j) {
      if (src_[j] != '\\' || j + 1 >= src_.size()) {
        value += src_[j];
        continue;
      }
      const char e = src_[++j];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        default: value += '\\', value += e; break;
      }
    }
    if (j >= src_.size()) Fail(i, "unterminated string literal");
    Emit(TokenKind::kString, std::move(value), i);
    return j + 1;
  }

  std::string_view src_;
  LexOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> Lex(std::string_view source, const LexOptions& options) { return Lexer(source, options).Run(); }

}  // namespace nibble::chat
