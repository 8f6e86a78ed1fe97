// Jinja values: construction from JSON, truthiness, printing (Python's str / repr), equality,
// and tojson.
#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace nibble::chat {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  v.Measure();
  return v;
}
Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  v.Measure();
  return v;
}
Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.is_ns_ = true;
  v.holds_ns_ = true;
  return v;
}

void Value::Measure() {
  int d = 0;
  auto see = [&](const Value& c) {
    d = std::max(d, c.depth_);
    holds_ns_ = holds_ns_ || c.holds_ns_;
  };
  if (list_) for (const Value& c : *list_) see(c);
  if (dict_) for (const auto& kv : *dict_) see(kv.second);
  depth_ = d + 1;
}

Value Value::Function(Callable fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<Callable>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return None();
    case nlohmann::json::value_t::boolean: return Bool(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Int(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Int(static_cast<int64_t>(u)) : Float(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: return Float(j.get<double>());
    case nlohmann::json::value_t::string: return String(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      ValueDict items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJson(it.value()));
      return Dict(std::move(items));
    }
    default: return Value();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !s_.empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->empty();
    case Kind::kCallable: return true;
  }
  return false;
}

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, then Python's layout: fixed between 1e-4 and 1e16, else exponent.
  const auto r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e + 1));
  if (exp10 >= -4 && exp10 < 16) {
    const auto r2 = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::fixed);
    std::string s(buf, r2.ptr);
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
  }
  std::string mant = sci.substr(0, e);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  return mant + ebuf;
}

namespace {
std::string QuoteRepr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + q;
}
}  // namespace

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kString: return QuoteRepr(s_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].Repr();
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i)
        out += (i ? ", " : "") + QuoteRepr((*dict_)[i].first) + ": " + (*dict_)[i].second.Repr();
      return out + "}";
    }
    default: return ToString();
  }
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return FormatFloat(f_);
    case Kind::kString: return s_;
    case Kind::kCallable: return "<function>";
    default: return Repr();
  }
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key) return &v;
  return nullptr;
}

void Value::Set(const std::string& key, Value v) {
  bool found = false;
  for (auto& [k, old] : *dict_)
    if (k == key) {
      old = std::move(v);
      found = true;
      break;
    }
  if (!found) dict_->emplace_back(key, std::move(v));
  const bool ns = is_ns_;
  Measure();
  holds_ns_ = holds_ns_ || ns;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "none";
    case Kind::kBool: return "boolean";
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kCallable: return "callable";
  }
  return "?";
}

bool ValuesEqual(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) return a.as_int() == b.as_int();
    return a.as_number() == b.as_number();
  }
  if (a.kind() == Value::Kind::kBool && b.is_number()) return (a.as_bool() ? 1.0 : 0.0) == b.as_number();
  if (b.kind() == Value::Kind::kBool && a.is_number()) return ValuesEqual(b, a);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kBool: return a.as_bool() == b.as_bool();
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (!ValuesEqual(a.list()[i], b.list()[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* o = b.Find(k);
        if (o == nullptr || !ValuesEqual(v, *o)) return false;
      }
      return true;
    }
    default: return &a.fn() == &b.fn();
  }
}

namespace {
void AppendJson(const Value& v, int indent, int depth, SourcePos pos, std::string& out) {
  const std::string pad = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string child = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const char* sep = indent > 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: out += nlohmann::json(v.as_number()).dump(); return;
    case Value::Kind::kString: out += nlohmann::json(v.str()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); return;
    case Value::Kind::kList:
      out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        out += i ? sep : "";
        out += child;
        AppendJson(v.list()[i], indent, depth + 1, pos, out);
      }
      if (!v.list().empty()) out += pad;
      out += ']';
      return;
    case Value::Kind::kDict:
      out += '{';
      for (size_t i = 0; i < v.dict().size(); ++i) {
        out += i ? sep : "";
        out += child;
        out += nlohmann::json(v.dict()[i].first).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ": ";
        AppendJson(v.dict()[i].second, indent, depth + 1, pos, out);
      }
      if (!v.dict().empty()) out += pad;
      out += '}';
      return;
    case Value::Kind::kCallable: throw JinjaError(pos, "tojson: a callable has no JSON form");
  }
}
}  // namespace

std::string ToJsonText(const Value& v, int indent, SourcePos pos) {
  std::string out;
  AppendJson(v, indent, 0, pos, out);
  return out;
}

}  // namespace nibble::chat
