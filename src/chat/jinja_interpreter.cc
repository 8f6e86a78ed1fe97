// Tree-walking renderer. Variables live in a chain of frames; loops and macro calls push one.
#include "chat/jinja_interpreter.h"

#include <cmath>
#include <utility>

#include "chat/jinja_builtins.h"

namespace nibble::chat {

namespace {

struct Frame {
  Frame* parent = nullptr;
  ValueDict vars;

  Value* Find(const std::string& name) {
    for (Frame* f = this; f != nullptr; f = f->parent)
      for (auto& [k, v] : f->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void Set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

// Values nest at most this deep (list and dict literals, namespace attributes).
constexpr int kMaxValueDepth = 64;
// Nested statements and expressions being evaluated at once, macro calls included.
constexpr int kMaxEvalDepth = 1024;

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits) : limits_(limits) {}

  std::string Run(const Body& body, const ValueDict& globals) {
    AddBuiltins();
    for (const auto& [k, v] : globals) root_.Set(k, v);
    Frame top{&root_, {}};
    top_ = &top;
    std::string out;
    if (Exec(body, top, out) != Flow::kNormal) throw JinjaError(SourcePos{}, "'break' or 'continue' outside a loop");
    return out;
  }

 private:
  void Step(SourcePos pos) {
    if (++steps_ > limits_.max_steps)
      throw JinjaError(pos, "template ran more than " + std::to_string(limits_.max_steps) + " steps");
  }
  // Statement + expression nesting of the running evaluation (macro calls stack the nesting of
  // their bodies): bounded so that the C++ stack is.
  struct Depth {
    Depth(Interpreter* in, SourcePos pos) : in_(in) {
      if (++in_->depth_ > kMaxEvalDepth) throw JinjaError(pos, "evaluation nested deeper than " + std::to_string(kMaxEvalDepth) + " levels");
    }
    ~Depth() { --in_->depth_; }
    Interpreter* in_;
  };
  void Write(std::string& out, const std::string& s, SourcePos pos) {
    if (out.size() + s.size() > limits_.max_output)
      throw JinjaError(pos, "rendered text exceeds " + std::to_string(limits_.max_output) + " bytes");
    out += s;
  }

  void AddBuiltins() {
    root_.Set("range", Value::Function([this](const CallArgs& a, SourcePos pos) { return Range(a, pos); }));
    root_.Set("namespace", Value::Function([](const CallArgs& a, SourcePos pos) {
      if (!a.positional.empty()) throw JinjaError(pos, "namespace() takes keyword arguments only");
      for (const auto& kv : a.keyword)
        if (kv.second.holds_namespace()) throw JinjaError(pos, "a namespace cannot hold a namespace");
      return Value::Namespace(a.keyword);
    }));
    root_.Set("dict", Value::Function([](const CallArgs& a, SourcePos pos) { return Value::Dict(a.keyword); }));
    root_.Set("raise_exception", Value::Function([](const CallArgs& a, SourcePos pos) -> Value {
      throw JinjaError(pos, "raise_exception: " + (a.positional.empty() ? std::string() : a.positional[0].ToString()));
    }));
  }

  Value Range(const CallArgs& a, SourcePos pos) {
    int64_t v[3] = {0, 0, 1};
    const size_t n = a.positional.size();
    if (n < 1 || n > 3) throw JinjaError(pos, "range() takes 1 to 3 integers");
    for (size_t i = 0; i < n; ++i)
      if (a.positional[i].kind() != Value::Kind::kInt) throw JinjaError(pos, "range() takes integers");
    if (n == 1) v[1] = a.positional[0].as_int();
    else for (size_t i = 0; i < n; ++i) v[i] = a.positional[i].as_int();
    if (v[2] == 0) throw JinjaError(pos, "range() step cannot be zero");
    ValueList items;
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
      CheckListSize(items.size() + 1, pos);
      Step(pos);
      items.push_back(Value::Int(i));
      if ((v[2] > 0 && i > INT64_MAX - v[2]) || (v[2] < 0 && i < INT64_MIN - v[2])) break;
    }
    return Value::List(std::move(items));
  }

  Flow Exec(const Body& body, Frame& f, std::string& out) {
    for (const StmtPtr& s : body) {
      const Flow fl = ExecOne(*s, f, out);
      if (fl != Flow::kNormal) return fl;
    }
    return Flow::kNormal;
  }

  Flow ExecOne(const Stmt& s, Frame& f, std::string& out) {
    Step(s.pos);
    Depth depth(this, s.pos);
    switch (s.kind) {
      case Stmt::Kind::kText: Write(out, s.text, s.pos); return Flow::kNormal;
      case Stmt::Kind::kOutput: Write(out, Eval(*s.exprs[0], f).ToString(), s.pos); return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.exprs.size(); ++i)
          if (Eval(*s.exprs[i], f).Truthy()) return Exec(s.bodies[i], f, out);
        return s.bodies.size() > s.exprs.size() ? Exec(s.bodies.back(), f, out) : Flow::kNormal;
      case Stmt::Kind::kFor: ExecFor(s, f, out); return Flow::kNormal;
      case Stmt::Kind::kSet: ExecSet(s, f, Eval(*s.exprs[0], f)); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        Frame inner{&f, {}};
        if (Exec(s.bodies[0], inner, captured) != Flow::kNormal) throw JinjaError(s.pos, "'break' or 'continue' inside a set block");
        f.Set(s.targets[0], Value::String(std::move(captured)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: DefineMacro(s, f); return Flow::kNormal;
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kBlock: return Exec(s.bodies[0], f, out);
    }
    return Flow::kNormal;
  }

  void ExecSet(const Stmt& s, Frame& f, Value v) {
    if (!s.attr.empty()) {
      Value* ns = f.Find(s.targets[0]);
      if (ns == nullptr || !ns->is_namespace())
        throw JinjaError(s.pos, "set " + s.targets[0] + "." + s.attr + ": '" + s.targets[0] + "' is not a namespace");
      if (v.holds_namespace()) throw JinjaError(s.pos, "a namespace cannot hold a namespace");
      if (v.depth() >= kMaxValueDepth) throw JinjaError(s.pos, "value nested deeper than " + std::to_string(kMaxValueDepth));
      ns->Set(s.attr, std::move(v));
      return;
    }
    if (s.targets.size() == 1) {
      f.Set(s.targets[0], std::move(v));
      return;
    }
    const ValueList items = Iterate(v, s.pos);
    if (items.size() != s.targets.size())
      throw JinjaError(s.pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(s.targets.size()) + " names");
    for (size_t i = 0; i < items.size(); ++i) f.Set(s.targets[i], items[i]);
  }

  void ExecFor(const Stmt& s, Frame& f, std::string& out) {
    ValueList items = Iterate(Eval(*s.exprs[0], f), s.pos);
    Frame inner{&f, {}};
    if (s.has_filter) {  // `for x in xs if cond`: the loop (and loop.length) sees the kept items only
      ValueList kept;
      for (Value& it : items) {
        Bind(s, inner, it);
        if (Eval(*s.exprs[1], inner).Truthy()) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Step(s.pos);
      inner.vars.clear();
      Bind(s, inner, items[static_cast<size_t>(i)]);
      ValueDict loop = {{"index0", Value::Int(i)},         {"index", Value::Int(i + 1)},
                        {"revindex0", Value::Int(n - i - 1)}, {"revindex", Value::Int(n - i)},
                        {"first", Value::Bool(i == 0)},     {"last", Value::Bool(i == n - 1)},
                        {"length", Value::Int(n)},          {"depth", Value::Int(1)}, {"depth0", Value::Int(0)}};
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      inner.Set("loop", Value::Dict(std::move(loop)));
      if (Exec(s.bodies[0], inner, out) == Flow::kBreak) break;
    }
    if (n == 0 && s.bodies.size() > 1) {
      Frame empty{&f, {}};
      Exec(s.bodies[1], empty, out);
    }
  }

  void Bind(const Stmt& s, Frame& inner, const Value& item) {
    if (s.targets.size() == 1) {
      inner.Set(s.targets[0], item);
      return;
    }
    const ValueList parts = Iterate(item, s.pos);
    if (parts.size() != s.targets.size())
      throw JinjaError(s.pos, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(s.targets.size()) + " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) inner.Set(s.targets[k], parts[k]);
  }

  void DefineMacro(const Stmt& s, Frame& f) {
    const Stmt* def = &s;
    f.Set(s.text, Value::Function([this, def](const CallArgs& a, SourcePos pos) { return CallMacro(*def, a, pos); }));
  }

  Value CallMacro(const Stmt& def, const CallArgs& a, SourcePos pos) {
    if (a.positional.size() > def.targets.size())
      throw JinjaError(pos, "macro '" + def.text + "' takes " + std::to_string(def.targets.size()) + " arguments, got " +
                                std::to_string(a.positional.size()));
    if (++call_depth_ > limits_.max_call_depth) throw JinjaError(pos, "macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    Frame frame{top_, {}};  // a macro sees the template-level names (itself included), not its caller's
    for (size_t i = 0; i < def.targets.size(); ++i) {
      const Value* given = i < a.positional.size() ? &a.positional[i] : nullptr;
      for (const auto& [k, v] : a.keyword)
        if (k == def.targets[i]) given = &v;
      frame.Set(def.targets[i], given ? *given : def.exprs[i] ? Eval(*def.exprs[i], frame) : Value());
    }
    std::string out;
    Exec(def.bodies[0], frame, out);
    --call_depth_;
    return Value::String(std::move(out));
  }

  CallArgs EvalArgs(const Expr& e, size_t from, Frame& f) {
    CallArgs a;
    for (size_t i = from; i < e.items.size(); ++i) {
      Value v = Eval(*e.items[i], f);
      if (e.names[i].empty()) a.positional.push_back(std::move(v));
      else a.keyword.emplace_back(e.names[i], std::move(v));
    }
    return a;
  }

  // Every value an expression yields is charged to the step budget by its size (a step per 64
  // bytes of a string, per list item or dict entry), so the bytes a render can copy and allocate
  // are bounded along with its time.
  Value Eval(const Expr& e, Frame& f) {
    Step(e.pos);
    Depth depth(this, e.pos);
    Value v = EvalInner(e, f);
    const size_t units = v.is_string() ? v.str().size() / 64 : v.is_list() ? v.list().size() : v.is_dict() ? v.dict().size() : 0;
    if (units > 0) {
      steps_ += static_cast<int64_t>(units);
      Step(e.pos);
    }
    return v;
  }

  Value EvalInner(const Expr& e, Frame& f) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: {
        const Value* v = f.Find(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::kList: {
        ValueList items;
        for (const ExprPtr& x : e.items) items.push_back(Eval(*x, f));
        return Checked(Value::List(std::move(items)), e.pos);
      }
      case Expr::Kind::kDict: {
        ValueDict items;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value k = Eval(*e.items[i], f);
          if (!k.is_string()) throw JinjaError(e.pos, std::string("dict keys must be strings, found ") + k.TypeName());
          Value v = Eval(*e.items[i + 1], f);
          bool found = false;
          for (auto& kv : items)
            if (kv.first == k.str()) kv.second = v, found = true;
          if (!found) items.emplace_back(k.str(), std::move(v));
        }
        return Checked(Value::Dict(std::move(items)), e.pos);
      }
      case Expr::Kind::kAttr: {
        const Value obj = Eval(*e.items[0], f);
        if (obj.is_undefined()) throw JinjaError(e.pos, "'" + Describe(*e.items[0]) + "' is undefined (reading ." + e.name + ")");
        const Value* v = obj.Find(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::kIndex: return GetItem(Eval(*e.items[0], f), Eval(*e.items[1], f), e.pos);
      case Expr::Kind::kSlice: {
        const Value obj = Eval(*e.items[0], f);
        auto opt = [&](size_t i) { return e.items[i] ? Eval(*e.items[i], f) : Value(); };
        return GetSlice(obj, opt(1), opt(2), opt(3), e.pos);
      }
      case Expr::Kind::kCall: return EvalCall(e, f);
      case Expr::Kind::kFilter: return ApplyFilter(e.name, Eval(*e.items[0], f), EvalArgs(e, 1, f), e.pos);
      case Expr::Kind::kTest: {
        const Expr& subject = *e.items[0];
        // `x is defined` on an attribute of an undefined value is false, not an error.
        const Value v = (e.name == "defined" || e.name == "undefined") ? EvalOrUndefined(subject, f) : Eval(subject, f);
        return Value::Bool(ApplyTest(e.name, v, EvalArgs(e, 1, f), e.pos) != e.negate);
      }
      case Expr::Kind::kUnary: return EvalUnary(e, f);
      case Expr::Kind::kBinary: return EvalBinary(e, f);
      case Expr::Kind::kTernary:
        if (Eval(*e.items[0], f).Truthy()) return Eval(*e.items[1], f);
        return e.items[2] ? Eval(*e.items[2], f) : Value();
    }
    return Value();
  }

  Value EvalOrUndefined(const Expr& e, Frame& f) {
    if (e.kind == Expr::Kind::kAttr) {
      const Value obj = EvalOrUndefined(*e.items[0], f);
      const Value* v = obj.Find(e.name);
      return v ? *v : Value();
    }
    return Eval(e, f);
  }

  static std::string Describe(const Expr& e) {
    if (e.kind == Expr::Kind::kName) return e.name;
    if (e.kind == Expr::Kind::kAttr) return Describe(*e.items[0]) + "." + e.name;
    return "expression";
  }

  Value Checked(Value v, SourcePos pos) {
    if (v.depth() > kMaxValueDepth) throw JinjaError(pos, "value nested deeper than " + std::to_string(kMaxValueDepth));
    return v;
  }

  Value EvalCall(const Expr& e, Frame& f) {
    const Expr& callee = *e.items[0];
    if (callee.kind == Expr::Kind::kAttr) {  // obj.method(...)
      const Value obj = Eval(*callee.items[0], f);
      const Value* member = obj.Find(callee.name);
      CallArgs args = EvalArgs(e, 1, f);
      if (member != nullptr && member->kind() == Value::Kind::kCallable) return member->fn()(args, e.pos);
      return CallMethod(obj, callee.name, args, e.pos);
    }
    const Value fn = Eval(callee, f);
    if (fn.kind() != Value::Kind::kCallable)
      throw JinjaError(e.pos, "'" + Describe(callee) + "' is " + (fn.is_undefined() ? "undefined" : std::string("a ") + fn.TypeName()) + ", not callable");
    return fn.fn()(EvalArgs(e, 1, f), e.pos);
  }

  Value EvalUnary(const Expr& e, Frame& f) {
    const Value v = Eval(*e.items[0], f);
    if (e.name == "not") return Value::Bool(!v.Truthy());
    if (v.kind() == Value::Kind::kInt)
      return e.name == "-" ? Value::Int(static_cast<int64_t>(0 - static_cast<uint64_t>(v.as_int()))) : v;
    if (v.kind() == Value::Kind::kFloat) return e.name == "-" ? Value::Float(-v.as_number()) : v;
    throw JinjaError(e.pos, "unary '" + e.name + "' on a " + v.TypeName());
  }

  Value EvalBinary(const Expr& e, Frame& f) {
    const std::string& op = e.name;
    if (op == "and" || op == "or") {  // short-circuit, Python's value semantics
      Value a = Eval(*e.items[0], f);
      if (a.Truthy() == (op == "or")) return a;
      return Eval(*e.items[1], f);
    }
    const Value a = Eval(*e.items[0], f);
    const Value b = Eval(*e.items[1], f);
    if (op == "==") return Value::Bool(ValuesEqual(a, b));
    if (op == "!=") return Value::Bool(!ValuesEqual(a, b));
    if (op == "<") return Value::Bool(CompareValues(a, b, e.pos) < 0);
    if (op == "<=") return Value::Bool(CompareValues(a, b, e.pos) <= 0);
    if (op == ">") return Value::Bool(CompareValues(a, b, e.pos) > 0);
    if (op == ">=") return Value::Bool(CompareValues(a, b, e.pos) >= 0);
    if (op == "in") return Value::Bool(Contains(b, a, e.pos));
    if (op == "not in") return Value::Bool(!Contains(b, a, e.pos));
    if (op == "~") {
      const std::string sa = a.ToString(), sb = b.ToString();
      CheckValueSize(sa.size() + sb.size(), e.pos);
      return Value::String(sa + sb);
    }
    return Arithmetic(op, a, b, e.pos);
  }

  Value Arithmetic(const std::string& op, const Value& a, const Value& b, SourcePos pos) {
    using K = Value::Kind;
    if (op == "+" && a.is_string() && b.is_string()) {
      CheckValueSize(a.str().size() + b.str().size(), pos);
      return Value::String(a.str() + b.str());
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      CheckListSize(a.list().size() + b.list().size(), pos);
      ValueList items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items));
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == K::kInt) return Repeat(a, b.as_int(), pos);
    if (op == "*" && (b.is_string() || b.is_list()) && a.kind() == K::kInt) return Repeat(b, a.as_int(), pos);
    if (!a.is_number() || !b.is_number())
      throw JinjaError(pos, std::string("unsupported operand types for ") + op + ": " + a.TypeName() + " and " + b.TypeName());
    if (a.kind() == K::kInt && b.kind() == K::kInt && op != "/" && op != "**") {
      // Wrapping arithmetic through unsigned: overflow is not undefined behaviour here.
      const uint64_t x = static_cast<uint64_t>(a.as_int()), y = static_cast<uint64_t>(b.as_int());
      if (op == "+") return Value::Int(static_cast<int64_t>(x + y));
      if (op == "-") return Value::Int(static_cast<int64_t>(x - y));
      if (op == "*") return Value::Int(static_cast<int64_t>(x * y));
      if (b.as_int() == 0) throw JinjaError(pos, "integer division or modulo by zero");
      if (a.as_int() == INT64_MIN && b.as_int() == -1) return op == "%" ? Value::Int(0) : a;
      int64_t q = a.as_int() / b.as_int(), r = a.as_int() % b.as_int();
      if (r != 0 && ((r < 0) != (b.as_int() < 0))) --q, r += b.as_int();  // Python floors
      return Value::Int(op == "//" ? q : r);
    }
    const double x = a.as_number(), y = b.as_number();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") {
      const double p = std::pow(x, y);
      if (a.kind() == K::kInt && b.kind() == K::kInt && y >= 0 && std::fabs(p) < 9.2e18) return Value::Int(static_cast<int64_t>(p));
      return Value::Float(p);
    }
    if (y == 0) throw JinjaError(pos, "division by zero");
    if (op == "/") return Value::Float(x / y);
    if (op == "//") return Value::Float(std::floor(x / y));
    return Value::Float(x - y * std::floor(x / y));
  }

  Value Repeat(const Value& v, int64_t n, SourcePos pos) {
    if (n <= 0) return v.is_string() ? Value::String("") : Value::List();
    const size_t unit = v.is_string() ? v.str().size() : v.list().size();
    const size_t cap = v.is_string() ? kMaxValueSize : kMaxListItems;
    if (unit > 0 && static_cast<uint64_t>(n) > cap / unit) {
      if (v.is_string()) CheckValueSize(kMaxValueSize + 1, pos);
      CheckListSize(kMaxListItems + 1, pos);
    }
    if (v.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n && unit > 0; ++i) s += v.str();
      return Value::String(std::move(s));
    }
    ValueList items;
    for (int64_t i = 0; i < n && unit > 0; ++i) items.insert(items.end(), v.list().begin(), v.list().end());
    return Value::List(std::move(items));
  }

  RenderLimits limits_;
  Frame root_;
  Frame* top_ = &root_;  // the template-level frame while Run runs
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string RenderTemplate(const Body& body, const ValueDict& globals, const RenderLimits& limits) {
  return Interpreter(limits).Run(body, globals);
}

}  // namespace nibble::chat
