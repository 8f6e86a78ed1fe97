// The values a chat template computes with (Jinja's data model, as Python's Jinja and
// @huggingface/jinja share it): undefined, none, bool, int, float, string, list, dict (insertion
// ordered, as Python dicts and JSON objects read), and callables (macros and globals such as
// namespace() or raise_exception()). Lists and dicts are shared by reference, so
// `ns.x = ...` and `list.append(...)` are seen through every name bound to them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nibble::chat {

/// A position in the template text, 1-based.
struct SourcePos {
  int line = 1;
  int col = 1;
};

/// What goes wrong while lexing, parsing or rendering: a message and where in the template.
/// Thrown inside the interpreter only; the entry points turn it into an Error.
class JinjaError : public std::runtime_error {
 public:
  JinjaError(SourcePos pos, const std::string& message)
      : std::runtime_error(message), pos_(pos) {}
  SourcePos pos() const { return pos_; }

 private:
  SourcePos pos_;
};

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;

/// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Callable = std::function<Value(const CallArgs&, SourcePos)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(ValueList items = {});
  static Value Dict(ValueDict items = {});
  static Value Function(Callable fn);
  /// A namespace(): a dict whose attributes `{% set ns.x = ... %}` may assign.
  static Value Namespace(ValueDict items);
  /// JSON → value (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return is_ns_; }
  /// Nesting depth (1 for a scalar or an empty list); the interpreter bounds it so that printing
  /// and destroying a value never recurses without limit.
  int depth() const { return depth_; }
  /// Whether a namespace is inside (or is) this value: storing one into a namespace could make
  /// a cycle, so the interpreter refuses it.
  bool holds_namespace() const { return holds_ns_; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& str() const { return s_; }
  ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const Callable& fn() const { return *fn_; }

  /// Jinja truthiness: undefined, none, false, 0, "", [] and {} are false.
  bool Truthy() const;
  /// What `{{ value }}` prints: strings as they are, none as "None", bools as "True"/"False",
  /// lists and dicts as Python's repr.
  std::string ToString() const;
  /// Python's repr (strings quoted), used inside printed lists and dicts.
  std::string Repr() const;
  /// The dict entry `key`, or nullptr (not a dict or no such key).
  const Value* Find(std::string_view key) const;
  /// Sets the dict entry `key` (appends it when new).
  void Set(const std::string& key, Value v);
  /// "undefined", "none", "boolean", "integer", "float", "string", "list", "dict", "callable".
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Callable> fn_;
  int depth_ = 1;
  bool is_ns_ = false;
  bool holds_ns_ = false;
  void Measure();  // depth_ and holds_ns_ from the children
};

/// Python's ==: numbers by value across int / float, lists and dicts element by element.
bool ValuesEqual(const Value& a, const Value& b);
/// Python's float formatting (repr): "1.0", "0.1", "1e-07", "inf".
std::string FormatFloat(double f);
/// JSON text of a value, as Jinja's tojson writes it (", " and ": " separators; indent > 0:
/// one item per line). Errors (thrown at `pos`): undefined or a callable inside.
std::string ToJsonText(const Value& v, int indent, SourcePos pos);

}  // namespace nibble::chat
