// Recursive-descent parser over the lexer's tokens.
#include "chat/jinja_parser.h"

#include <initializer_list>
#include <utility>

namespace nibble::chat {

namespace {

std::string Describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kText: return "text";
    case TokenKind::kEnd: return "the end of the template";
    case TokenKind::kExprClose: return "'}}'";
    case TokenKind::kBlockClose: return "'%}'";
    case TokenKind::kString: return "a string";
    default: return "'" + t.text + "'";
  }
}

StmtPtr NewStmt(Stmt::Kind k, SourcePos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = k;
  s->pos = pos;
  return s;
}
ExprPtr NewExpr(Expr::Kind k, SourcePos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->pos = pos;
  return e;
}

std::string Where(SourcePos p) { return std::to_string(p.line) + ":" + std::to_string(p.col); }

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body Template() {
    std::string end;
    Body body = ParseBody({}, "", SourcePos{}, &end);
    return body;
  }

 private:
  // Nesting guard: one level per nested statement body or expression.
  struct Nest {
    explicit Nest(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting)
        throw JinjaError(p_->Peek().pos, "template nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nest() { --p_->depth_; }
    Parser* p_;
  };

  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& Next() {
    const Token& t = Peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == TokenKind::kOperator && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == TokenKind::kName && Peek(ahead).text == name;
  }
  bool Accept(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  [[noreturn]] void Unexpected(const std::string& expected) const {
    throw JinjaError(Peek().pos, "expected " + expected + ", found " + Describe(Peek()));
  }
  void Expect(const char* op) {
    if (!Accept(op)) Unexpected(std::string("'") + op + "'");
  }
  std::string ExpectName(const char* what) {
    if (Peek().kind != TokenKind::kName) Unexpected(what);
    return Next().text;
  }
  void ExpectBlockClose() {
    if (Peek().kind != TokenKind::kBlockClose) Unexpected("'%}'");
    Next();
  }

  // Statements up to one of `ends` (a {% name %} tag, consumed with its name; *end says which).
  Body ParseBody(std::initializer_list<const char*> ends, const std::string& opener, SourcePos opened, std::string* end) {
    Nest nest(this);
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == TokenKind::kEnd) {
        if (ends.size() == 0) return body;
        throw JinjaError(opened, "unclosed '" + opener + "' block opened at " + Where(opened) +
                                     ": reached the end of the template looking for '" + *ends.begin() + "'");
      }
      if (t.kind == TokenKind::kText) {
        auto s = NewStmt(Stmt::Kind::kText, t.pos);
        s->text = Next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kExprOpen) {
        auto s = NewStmt(Stmt::Kind::kOutput, Next().pos);
        s->exprs.push_back(ParseExpr());
        if (Peek().kind != TokenKind::kExprClose) Unexpected("'}}'");
        Next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockOpen) {
        const Token& name = Peek(1);
        for (const char* e : ends)
          if (name.kind == TokenKind::kName && name.text == e) {
            Next();
            *end = Next().text;
            return body;
          }
        if (ends.size() > 0 && name.kind == TokenKind::kName &&
            (name.text.rfind("end", 0) == 0 || name.text == "elif" || name.text == "else"))
          throw JinjaError(name.pos, "unexpected '" + name.text + "': the '" + opener + "' block opened at " + Where(opened) +
                                         " is still open (expected '" + *ends.begin() + "')");
        body.push_back(ParseStatement());
      } else {
        Unexpected("text or a tag");
      }
    }
  }

  StmtPtr ParseStatement() {
    Next();  // {%
    const Token& tok = Peek();
    if (tok.kind != TokenKind::kName) Unexpected("a tag name");
    const std::string name = tok.text;
    const SourcePos pos = tok.pos;
    Next();
    if (name == "if") return ParseIf(pos);
    if (name == "for") return ParseFor(pos);
    if (name == "set") return ParseSet(pos);
    if (name == "macro") return ParseMacro(pos);
    if (name == "break" || name == "continue") {
      ExpectBlockClose();
      return NewStmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, pos);
    }
    if (name == "generation") {
      ExpectBlockClose();
      auto s = NewStmt(Stmt::Kind::kBlock, pos);
      std::string end;
      s->bodies.push_back(ParseBody({"endgeneration"}, name, pos, &end));
      ExpectBlockClose();
      return s;
    }
    static const char* const kUnsupported[] = {"raw", "call", "filter", "include", "import", "from", "extends",
                                               "block", "with", "do", "autoescape", "trans"};
    for (const char* u : kUnsupported)
      if (name == u) throw JinjaError(pos, "unsupported tag '" + name + "'");
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else")
      throw JinjaError(pos, "unexpected '" + name + "': no open block it closes");
    throw JinjaError(pos, "unknown tag '" + name + "'");
  }

  StmtPtr ParseIf(SourcePos pos) {
    auto s = NewStmt(Stmt::Kind::kIf, pos);
    while (true) {
      s->exprs.push_back(ParseExpr());
      ExpectBlockClose();
      std::string end;
      s->bodies.push_back(ParseBody({"endif", "elif", "else"}, "if", pos, &end));
      if (end == "elif") continue;
      if (end == "else") {
        ExpectBlockClose();
        s->bodies.push_back(ParseBody({"endif"}, "if", pos, &end));
      }
      ExpectBlockClose();
      return s;
    }
  }

  StmtPtr ParseFor(SourcePos pos) {
    auto s = NewStmt(Stmt::Kind::kFor, pos);
    s->targets.push_back(ExpectName("a loop variable name"));
    while (Accept(",")) s->targets.push_back(ExpectName("a loop variable name"));
    if (!IsName("in")) Unexpected("'in'");
    Next();
    s->exprs.push_back(ParseOr());
    if (IsName("if")) {
      Next();
      s->exprs.push_back(ParseOr());
      s->has_filter = true;
    }
    if (IsName("recursive")) throw JinjaError(Peek().pos, "unsupported: recursive for loops");
    ExpectBlockClose();
    std::string end;
    s->bodies.push_back(ParseBody({"endfor", "else"}, "for", pos, &end));
    if (end == "else") {
      ExpectBlockClose();
      s->bodies.push_back(ParseBody({"endfor"}, "for", pos, &end));
    }
    ExpectBlockClose();
    return s;
  }

  StmtPtr ParseSet(SourcePos pos) {
    auto s = NewStmt(Stmt::Kind::kSet, pos);
    s->targets.push_back(ExpectName("a variable name"));
    if (Accept(".")) {
      s->attr = ExpectName("an attribute name");
    } else {
      while (Accept(",")) s->targets.push_back(ExpectName("a variable name"));
    }
    if (Peek().kind == TokenKind::kBlockClose && s->targets.size() == 1 && s->attr.empty()) {
      Next();
      s->kind = Stmt::Kind::kSetBlock;
      std::string end;
      s->bodies.push_back(ParseBody({"endset"}, "set", pos, &end));
      ExpectBlockClose();
      return s;
    }
    Expect("=");
    s->exprs.push_back(ParseTupleOrExpr());
    ExpectBlockClose();
    return s;
  }

  StmtPtr ParseMacro(SourcePos pos) {
    auto s = NewStmt(Stmt::Kind::kMacro, pos);
    s->text = ExpectName("a macro name");
    Expect("(");
    while (!IsOp(")")) {
      s->targets.push_back(ExpectName("a parameter name"));
      s->exprs.push_back(Accept("=") ? ParseExpr() : nullptr);
      if (!Accept(",")) break;
    }
    Expect(")");
    ExpectBlockClose();
    std::string end;
    s->bodies.push_back(ParseBody({"endmacro"}, "macro", pos, &end));
    ExpectBlockClose();
    return s;
  }

  ExprPtr Node(Expr::Kind k, SourcePos pos, std::string name = "") {
    auto e = NewExpr(k, pos);
    e->name = std::move(name);
    return e;
  }
  ExprPtr Binary(const std::string& op, ExprPtr a, ExprPtr b, SourcePos pos) {
    ExprPtr e = Node(Expr::Kind::kBinary, pos, op);
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  // `a, b` on the right of a set is a tuple (a list here).
  ExprPtr ParseTupleOrExpr() {
    const SourcePos pos = Peek().pos;
    ExprPtr first = ParseExpr();
    if (!IsOp(",")) return first;
    ExprPtr list = Node(Expr::Kind::kList, pos);
    list->items.push_back(std::move(first));
    while (Accept(",")) {
      if (Peek().kind == TokenKind::kBlockClose) break;
      list->items.push_back(ParseExpr());
    }
    return list;
  }

  ExprPtr ParseExpr() {
    Nest nest(this);
    ExprPtr e = ParseOr();
    while (IsName("if")) {
      const SourcePos pos = Next().pos;
      ExprPtr t = Node(Expr::Kind::kTernary, pos);
      t->items.push_back(ParseOr());
      t->items.push_back(std::move(e));
      if (IsName("else")) {
        Next();
        t->items.push_back(ParseExpr());
      } else {
        t->items.push_back(nullptr);
      }
      e = std::move(t);
    }
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const SourcePos pos = Next().pos;
      e = Binary("or", std::move(e), ParseAnd(), pos);
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const SourcePos pos = Next().pos;
      e = Binary("and", std::move(e), ParseNot(), pos);
    }
    return e;
  }
  ExprPtr ParseNot() {
    if (IsName("not")) {
      Nest nest(this);
      const SourcePos pos = Next().pos;
      ExprPtr e = Node(Expr::Kind::kUnary, pos, "not");
      e->items.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr e = ParseMath1();
    while (true) {
      const SourcePos pos = Peek().pos;
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return e;
      }
      e = Binary(op, std::move(e), ParseMath1(), pos);
    }
  }
  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = Next();
      e = Binary(t.text, std::move(e), ParseConcat(), t.pos);
    }
    return e;
  }
  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      const SourcePos pos = Next().pos;
      e = Binary("~", std::move(e), ParseMath2(), pos);
    }
    return e;
  }
  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = Next();
      e = Binary(t.text, std::move(e), ParsePow(), t.pos);
    }
    return e;
  }
  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      const SourcePos pos = Next().pos;
      e = Binary("**", std::move(e), ParseUnary(true), pos);
    }
    return e;
  }
  ExprPtr ParseUnary(bool with_filter) {
    Nest nest(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      e = Node(Expr::Kind::kUnary, t.pos, t.text);
      e->items.push_back(ParseUnary(false));
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    return with_filter ? ParseFilters(std::move(e)) : std::move(e);
  }

  // (args) after a call, filter or test: positional, then name=value.
  void ParseArgs(Expr* e) {
    Expect("(");
    while (!IsOp(")")) {
      if (Peek().kind == TokenKind::kName && IsOp("=", 1)) {
        e->names.push_back(Next().text);
        Next();
      } else {
        e->names.emplace_back();
      }
      e->items.push_back(ParseExpr());
      if (!Accept(",")) break;
    }
    Expect(")");
  }

  ExprPtr ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Next();
        const SourcePos pos = Peek().pos;
        ExprPtr f = Node(Expr::Kind::kFilter, pos, ExpectName("a filter name"));
        f->items.push_back(std::move(e));
        f->names.emplace_back();
        if (IsOp("(")) ParseArgs(f.get());
        e = std::move(f);
      } else if (IsName("is")) {
        const SourcePos pos = Next().pos;
        const bool negate = IsName("not") && (Next(), true);
        if (Peek().kind != TokenKind::kName) Unexpected("a test name");
        ExprPtr t = Node(Expr::Kind::kTest, pos, Next().text);
        t->negate = negate;
        t->items.push_back(std::move(e));
        t->names.emplace_back();
        if (IsOp("(")) ParseArgs(t.get());
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      const SourcePos pos = Peek().pos;
      if (Accept(".")) {
        ExprPtr a = Node(Expr::Kind::kAttr, pos);
        if (Peek().kind == TokenKind::kInt) {  // x.0 is x[0]
          a->kind = Expr::Kind::kIndex;
          a->items.push_back(std::move(e));
          ExprPtr idx = Node(Expr::Kind::kLiteral, pos);
          idx->value = Value::Int(Next().int_value);
          a->items.push_back(std::move(idx));
        } else {
          a->name = ExpectName("an attribute name");
          a->items.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        e = ParseSubscript(std::move(e));
      } else if (IsOp("(")) {
        ExprPtr c = Node(Expr::Kind::kCall, e->pos);
        c->items.push_back(std::move(e));
        c->names.emplace_back();
        ParseArgs(c.get());
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr e) {
    const SourcePos pos = Next().pos;  // [
    ExprPtr start = IsOp(":") ? nullptr : ParseExpr();
    if (Accept("]")) {
      ExprPtr idx = Node(Expr::Kind::kIndex, pos);
      idx->items.push_back(std::move(e));
      idx->items.push_back(std::move(start));
      return idx;
    }
    ExprPtr s = Node(Expr::Kind::kSlice, pos);
    s->items.push_back(std::move(e));
    s->items.push_back(std::move(start));
    Expect(":");
    s->items.push_back(IsOp(":") || IsOp("]") ? nullptr : ParseExpr());
    if (Accept(":")) s->items.push_back(IsOp("]") ? nullptr : ParseExpr());
    else s->items.push_back(nullptr);
    Expect("]");
    return s;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Peek();
    const SourcePos pos = t.pos;
    ExprPtr lit = Node(Expr::Kind::kLiteral, pos);
    switch (t.kind) {
      case TokenKind::kName: {
        const std::string n = Next().text;
        if (n == "true" || n == "True") lit->value = Value::Bool(true);
        else if (n == "false" || n == "False") lit->value = Value::Bool(false);
        else if (n == "none" || n == "None") lit->value = Value::None();
        else return Node(Expr::Kind::kName, pos, n);
        return lit;
      }
      case TokenKind::kString: {
        std::string s = Next().text;
        while (Peek().kind == TokenKind::kString) s += Next().text;  // "a" "b" is "ab"
        lit->value = Value::String(std::move(s));
        return lit;
      }
      case TokenKind::kInt: lit->value = Value::Int(Next().int_value); return lit;
      case TokenKind::kFloat: lit->value = Value::Float(Next().float_value); return lit;
      default: break;
    }
    if (Accept("(")) {
      if (Accept(")")) return Node(Expr::Kind::kList, pos);
      ExprPtr e = ParseExpr();
      if (!IsOp(",")) {
        Expect(")");
        return e;
      }
      ExprPtr tuple = Node(Expr::Kind::kList, pos);
      tuple->items.push_back(std::move(e));
      while (Accept(",") && !IsOp(")")) tuple->items.push_back(ParseExpr());
      Expect(")");
      return tuple;
    }
    if (Accept("[")) {
      ExprPtr list = Node(Expr::Kind::kList, pos);
      while (!IsOp("]")) {
        list->items.push_back(ParseExpr());
        if (!Accept(",")) break;
      }
      Expect("]");
      return list;
    }
    if (Accept("{")) {
      ExprPtr dict = Node(Expr::Kind::kDict, pos);
      while (!IsOp("}")) {
        dict->items.push_back(ParseExpr());
        Expect(":");
        dict->items.push_back(ParseExpr());
        if (!Accept(",")) break;
      }
      Expect("}");
      return dict;
    }
    Unexpected("an expression");
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Body Parse(std::string_view source, const LexOptions& options) { return Parser(Lex(source, options)).Template(); }

}  // namespace nibble::chat
