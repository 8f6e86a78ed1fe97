// Filters, tests and methods. Strings are UTF-8; case mapping is ASCII only (the chat templates
// of the supported families apply it to role names and ASCII markers).
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace nibble::chat {

namespace {

[[noreturn]] void Throw(SourcePos pos, const std::string& msg) { throw JinjaError(pos, msg); }

// Positional argument i, or keyword `kw`; nullptr when neither is given.
const Value* Arg(const CallArgs& a, size_t i, const char* kw) {
  if (i < a.positional.size()) return &a.positional[i];
  for (const auto& [k, v] : a.keyword)
    if (k == kw) return &v;
  return nullptr;
}

const std::string& StringArg(const CallArgs& a, size_t i, const char* kw, const std::string& what, SourcePos pos) {
  const Value* v = Arg(a, i, kw);
  if (v == nullptr || !v->is_string())
    Throw(pos, what + ": argument '" + kw + "' must be a string, found " + (v ? v->TypeName() : "nothing"));
  return v->str();
}

int64_t IntArg(const CallArgs& a, size_t i, const char* kw, int64_t dflt, const std::string& what, SourcePos pos) {
  const Value* v = Arg(a, i, kw);
  if (v == nullptr || v->is_none()) return dflt;
  if (v->kind() != Value::Kind::kInt) Throw(pos, what + ": argument '" + kw + "' must be an integer, found " + v->TypeName());
  return v->as_int();
}

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string StripChars(const std::string& s, const Value* chars, bool left, bool right, SourcePos pos) {
  if (chars != nullptr && !chars->is_none() && !chars->is_string()) Throw(pos, std::string("strip: characters must be a string, found ") + chars->TypeName());
  const bool ws = chars == nullptr || chars->is_none();
  auto strip_it = [&](char c) { return ws ? IsWs(c) : chars->str().find(c) != std::string::npos; };
  size_t b = 0, e = s.size();
  if (left) while (b < e && strip_it(s[b])) ++b;
  if (right) while (e > b && strip_it(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
bool IsAlpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }

// Python's str.title(): a letter after a non-letter is upper-cased, the others lower-cased.
std::string PyTitle(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    c = static_cast<char>(prev_alpha ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c)));
    prev_alpha = IsAlpha(c);
  }
  return out;
}
// Jinja's title filter: words start after whitespace, '-', '(', '{', '[' or '<'.
std::string JinjaTitle(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool sep = IsWs(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    start = sep;
  }
  return out;
}
std::string Capitalize(const std::string& s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count, SourcePos pos) {
  // Occurrences, left to right, at most `count` (< 0: all); an empty `from` matches between
  // characters. Counted first so that the size is checked before anything is built.
  auto for_each = [&](auto&& visit) {
    int64_t n = 0;
    if (from.empty()) {
      for (size_t i = 0; i <= s.size() && (count < 0 || n < count); ++i, ++n) visit(i);
    } else {
      for (size_t i = s.find(from); i != std::string::npos && (count < 0 || n < count); i = s.find(from, i + from.size()), ++n)
        visit(i);
    }
  };
  size_t hits = 0;
  for_each([&](size_t) { ++hits; });
  if (to.size() > 0 && hits > kMaxValueSize / to.size()) CheckValueSize(kMaxValueSize + 1, pos);
  CheckValueSize(s.size() + hits * to.size(), pos);
  std::string out;
  size_t last = 0;
  for_each([&](size_t i) {
    out.append(s, last, i - last);
    out += to;
    last = i + from.size();
  });
  if (last <= s.size()) out.append(s, last, std::string::npos);
  return out;
}

Value Split(const std::string& s, const Value* sep, int64_t maxsplit, SourcePos pos) {
  ValueList parts;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsWs(s[i])) ++i;
      if (i >= s.size()) break;
      size_t j = i;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) j = s.size();
      else while (j < s.size() && !IsWs(s[j])) ++j;
      CheckListSize(parts.size() + 1, pos);
      parts.push_back(Value::String(s.substr(i, j - i)));
      i = j;
    }
    return Value::List(std::move(parts));
  }
  if (!sep->is_string()) Throw(pos, std::string("split: separator must be a string, found ") + sep->TypeName());
  const std::string& d = sep->str();
  if (d.empty()) Throw(pos, "split: empty separator");
  size_t last = 0;
  for (size_t i = s.find(d); i != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit);
       i = s.find(d, last)) {
    CheckListSize(parts.size() + 1, pos);
    parts.push_back(Value::String(s.substr(last, i - last)));
    last = i + d.size();
  }
  parts.push_back(Value::String(s.substr(last)));
  return Value::List(std::move(parts));
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix, SourcePos pos) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) Throw(pos, std::string(prefix ? "startswith" : "endswith") + ": expected a string, found " + a.TypeName());
    const std::string& p = a.str();
    return p.size() <= s.size() && (prefix ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
  };
  if (affix.is_list()) return std::any_of(affix.list().begin(), affix.list().end(), one);
  return one(affix);
}

// `x.a.b` for selectattr / map / sort / join attribute=.
Value AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  while (b <= path.size()) {
    const size_t e = std::min(path.find('.', b), path.size());
    const Value* next = cur.Find(path.substr(b, e - b));
    if (next == nullptr) return Value();
    cur = *next;
    b = e + 1;
  }
  return cur;
}

CallArgs Rest(const CallArgs& a, size_t from) {
  CallArgs r;
  for (size_t i = from; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  return r;
}

Value Length(const Value& v, SourcePos pos) {
  if (v.is_string()) return Value::Int(static_cast<int64_t>(Utf8Length(v.str())));
  if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
  if (v.is_dict()) return Value::Int(static_cast<int64_t>(v.dict().size()));
  if (v.is_undefined()) return Value::Int(0);
  Throw(pos, std::string("length: a ") + v.TypeName() + " has no length");
}

Value JoinFilter(const Value& v, const CallArgs& a, SourcePos pos) {
  const Value* sep = Arg(a, 0, "d");
  const Value* attr = Arg(a, 1, "attribute");
  std::string out;
  size_t i = 0;
  for (const Value& item : Iterate(v, pos)) {
    if (i++ > 0 && sep != nullptr) out += sep->ToString();
    out += (attr != nullptr ? AttrPath(item, attr->ToString()) : item).ToString();
    CheckValueSize(out.size(), pos);
  }
  return Value::String(std::move(out));
}

Value SelectFilter(const std::string& name, const Value& v, const CallArgs& a, SourcePos pos) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "selectattr" || name == "select";
  const size_t test_at = by_attr ? 1 : 0;
  const Value* test = Arg(a, test_at, "test");
  if (by_attr && Arg(a, 0, "attribute") == nullptr) Throw(pos, name + ": missing the attribute name");
  const std::string attr = by_attr ? Arg(a, 0, "attribute")->ToString() : "";
  const CallArgs targs = Rest(a, test_at + 1);
  ValueList out;
  for (const Value& item : Iterate(v, pos)) {
    const Value x = by_attr ? AttrPath(item, attr) : item;
    const bool pass = test == nullptr ? x.Truthy() : ApplyTest(test->ToString(), x, targs, pos);
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value MapFilter(const Value& v, const CallArgs& a, SourcePos pos) {
  ValueList out;
  const Value* attr = Arg(a, 99, "attribute");
  const Value* dflt = Arg(a, 99, "default");
  if (attr == nullptr && a.positional.empty()) Throw(pos, "map: needs a filter name or attribute=");
  for (const Value& item : Iterate(v, pos)) {
    if (attr != nullptr) {
      Value x = AttrPath(item, attr->ToString());
      out.push_back(x.is_undefined() && dflt != nullptr ? *dflt : x);
    } else {
      out.push_back(ApplyFilter(a.positional[0].ToString(), item, Rest(a, 1), pos));
    }
  }
  return Value::List(std::move(out));
}

Value SortFilter(const Value& v, const CallArgs& a, SourcePos pos) {
  ValueList items = Iterate(v, pos);
  const Value* rev = Arg(a, 0, "reverse");
  const Value* attr = Arg(a, 2, "attribute");
  auto key = [&](const Value& x) { return attr != nullptr ? AttrPath(x, attr->ToString()) : x; };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return CompareValues(key(x), key(y), pos) < 0; });
  if (rev != nullptr && rev->Truthy()) std::reverse(items.begin(), items.end());
  return Value::List(std::move(items));
}

Value ToIntValue(const Value& v, const CallArgs& a, SourcePos pos) {
  if (v.kind() == Value::Kind::kInt) return v;
  if (v.kind() == Value::Kind::kFloat) return std::isfinite(v.as_number()) ? Value::Int(static_cast<int64_t>(v.as_number())) : Value::Int(0);
  if (v.kind() == Value::Kind::kBool) return Value::Int(v.as_bool() ? 1 : 0);
  if (v.is_string()) {
    const std::string s = StripChars(v.str(), nullptr, true, true, pos);
    char* end = nullptr;
    errno = 0;
    const long long r = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::Int(r);
  }
  return Value::Int(IntArg(a, 0, "default", 0, "int", pos));
}

Value ToFloatValue(const Value& v, SourcePos pos) {
  if (v.is_number()) return Value::Float(v.as_number());
  if (v.is_string()) {
    const std::string s = StripChars(v.str(), nullptr, true, true, pos);
    char* end = nullptr;
    const double r = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(r);
  }
  return Value::Float(0);
}

Value MinMax(const Value& v, bool want_max, SourcePos pos) {
  const ValueList items = Iterate(v, pos);
  if (items.empty()) return Value();
  Value best = items[0];
  for (const Value& x : items)
    if ((CompareValues(x, best, pos) > 0) == want_max && CompareValues(x, best, pos) != 0) best = x;
  return best;
}

Value Indent(const Value& v, const CallArgs& a, SourcePos pos) {
  const Value* w = Arg(a, 0, "width");
  const std::string pad = w == nullptr ? "    " : w->is_string() ? w->str() : std::string(static_cast<size_t>(std::clamp<int64_t>(w->kind() == Value::Kind::kInt ? w->as_int() : 4, 0, 1024)), ' ');
  const Value* first = Arg(a, 1, "first");
  const Value* blank = Arg(a, 2, "blank");
  const std::string s = v.ToString();
  std::string out;
  size_t b = 0;
  bool first_line = true;
  while (b <= s.size()) {
    const size_t e = std::min(s.find('\n', b), s.size());
    const std::string line = s.substr(b, e - b);
    const bool indent = (!first_line || (first && first->Truthy())) && (!line.empty() || (blank && blank->Truthy()));
    out += (indent ? pad : "") + line;
    if (e < s.size()) out += '\n';
    CheckValueSize(out.size(), pos);
    first_line = false;
    b = e + 1;
  }
  return Value::String(std::move(out));
}

}  // namespace

void CheckValueSize(size_t n, SourcePos pos) {
  if (n > kMaxValueSize) Throw(pos, "value of " + std::to_string(n) + " bytes or items exceeds the limit of " + std::to_string(kMaxValueSize));
}

namespace {
// Bytes of the UTF-8 character starting at s[i] (1 for a stray or truncated byte).
size_t Utf8CharLen(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}
}  // namespace

std::vector<uint32_t> Utf8Starts(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size(); i += Utf8CharLen(s, i)) out.push_back(static_cast<uint32_t>(i));
  return out;
}

size_t Utf8Length(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += Utf8CharLen(s, i)) ++n;
  return n;
}

void CheckListSize(size_t n, SourcePos pos) {
  if (n > kMaxListItems) Throw(pos, "list of " + std::to_string(n) + " items exceeds the limit of " + std::to_string(kMaxListItems));
}

int CompareValues(const Value& a, const Value& b, SourcePos pos) {
  auto num = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
  auto as_d = [](const Value& v) { return v.kind() == Value::Kind::kBool ? (v.as_bool() ? 1.0 : 0.0) : v.as_number(); };
  if (num(a) && num(b)) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return as_d(a) < as_d(b) ? -1 : as_d(a) > as_d(b) ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < std::min(a.list().size(), b.list().size()); ++i)
      if (const int c = CompareValues(a.list()[i], b.list()[i], pos); c != 0) return c;
    return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size();
  }
  Throw(pos, std::string("cannot order a ") + a.TypeName() + " and a " + b.TypeName());
}

Value GetItem(const Value& obj, const Value& key, SourcePos pos) {
  if (obj.is_dict()) {
    if (!key.is_string()) return Value();
    const Value* v = obj.Find(key.str());
    return v ? *v : Value();
  }
  if ((obj.is_list() || obj.is_string()) && key.kind() == Value::Kind::kInt) {
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list().size());
      const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      return i >= 0 && i < n ? obj.list()[static_cast<size_t>(i)] : Value();
    }
    const std::vector<uint32_t> starts = Utf8Starts(obj.str());
    const int64_t n = static_cast<int64_t>(starts.size());
    const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
    if (i < 0 || i >= n) return Value();
    const size_t b = starts[static_cast<size_t>(i)];
    const size_t e = i + 1 < n ? starts[static_cast<size_t>(i + 1)] : obj.str().size();
    return Value::String(obj.str().substr(b, e - b));
  }
  if (obj.is_undefined()) Throw(pos, "cannot subscript an undefined value");
  if (obj.is_list() || obj.is_string() || obj.is_none()) {
    if (obj.is_none()) Throw(pos, "cannot subscript none");
    Throw(pos, std::string("a ") + obj.TypeName() + " index must be an integer, found " + key.TypeName());
  }
  return Value();
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step, SourcePos pos) {
  if (!obj.is_list() && !obj.is_string()) Throw(pos, std::string("cannot slice a ") + obj.TypeName());
  std::vector<uint32_t> starts;
  if (obj.is_string()) starts = Utf8Starts(obj.str());
  const int64_t n = static_cast<int64_t>(obj.is_list() ? obj.list().size() : starts.size());
  auto char_at = [&](int64_t i) {
    const size_t b = starts[static_cast<size_t>(i)];
    const size_t e = i + 1 < n ? starts[static_cast<size_t>(i + 1)] : obj.str().size();
    return obj.str().substr(b, e - b);
  };
  auto bound = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.kind() != Value::Kind::kInt) Throw(pos, std::string("slice ") + what + " must be an integer, found " + v.TypeName());
    return v.as_int();
  };
  const int64_t st = bound(step, "step").value_or(1);
  if (st == 0) Throw(pos, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    return st > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(bound(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(bound(stop, "stop"), st > 0 ? n : -1);
  ValueList items;
  std::string s;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_list()) items.push_back(obj.list()[static_cast<size_t>(i)]);
    else s += char_at(i);
  }
  return obj.is_list() ? Value::List(std::move(items)) : Value::String(std::move(s));
}

ValueList Iterate(const Value& v, SourcePos pos) {
  if (v.is_list()) return v.list();
  if (v.is_undefined()) return {};
  ValueList out;
  if (v.is_dict()) {
    for (const auto& kv : v.dict()) out.push_back(Value::String(kv.first));
  } else if (v.is_string()) {
    const std::vector<uint32_t> starts = Utf8Starts(v.str());
    CheckListSize(starts.size(), pos);
    for (size_t i = 0; i < starts.size(); ++i)
      out.push_back(Value::String(v.str().substr(starts[i], (i + 1 < starts.size() ? starts[i + 1] : v.str().size()) - starts[i])));
  } else {
    Throw(pos, std::string("cannot iterate over a ") + v.TypeName());
  }
  return out;
}

bool Contains(const Value& hay, const Value& needle, SourcePos pos) {
  if (hay.is_string()) {
    if (!needle.is_string()) Throw(pos, std::string("'in <string>' needs a string on the left, found ") + needle.TypeName());
    return hay.str().find(needle.str()) != std::string::npos;
  }
  if (hay.is_list()) {
    for (const Value& x : hay.list())
      if (ValuesEqual(x, needle)) return true;
    return false;
  }
  if (hay.is_dict()) return needle.is_string() && hay.Find(needle.str()) != nullptr;
  if (hay.is_undefined()) return false;
  Throw(pos, std::string("'in' needs a string, list or dict on the right, found ") + hay.TypeName());
}

Value ApplyFilter(const std::string& name, const Value& v, const CallArgs& a, SourcePos pos) {
  if (name == "trim") return Value::String(StripChars(v.ToString(), Arg(a, 0, "chars"), true, true, pos));
  if (name == "length" || name == "count") return Length(v, pos);
  if (name == "tojson") return Value::String(ToJsonText(v, static_cast<int>(std::clamp<int64_t>(IntArg(a, 0, "indent", 0, name, pos), 0, 64)), pos));
  if (name == "string") return Value::String(v.ToString());
  if (name == "upper") return Value::String(Upper(v.ToString()));
  if (name == "lower") return Value::String(Lower(v.ToString()));
  if (name == "title") return Value::String(JinjaTitle(v.ToString()));
  if (name == "capitalize") return Value::String(Capitalize(v.ToString()));
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return v;
    Throw(pos, "unsupported filter '" + name + "' (chat templates render without autoescape)");
  }
  if (name == "default" || name == "d") {
    const Value* boolean = Arg(a, 1, "boolean");
    const bool use = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
    const Value* d = Arg(a, 0, "default_value");
    return use ? (d ? *d : Value::String("")) : v;
  }
  if (name == "first" || name == "last") {
    const ValueList items = Iterate(v, pos);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") return JoinFilter(v, a, pos);
  if (name == "items") {
    if (v.is_undefined()) return Value::List();
    if (!v.is_dict()) Throw(pos, std::string("items: expected a dict, found ") + v.TypeName());
    return CallMethod(v, "items", CallArgs{}, pos);
  }
  if (name == "replace") {
    if (!v.is_string()) Throw(pos, std::string("replace: expected a string, found ") + v.TypeName());
    return Value::String(Replace(v.str(), StringArg(a, 0, "old", name, pos), StringArg(a, 1, "new", name, pos),
                                 IntArg(a, 2, "count", -1, name, pos), pos));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") return SelectFilter(name, v, a, pos);
  if (name == "map") return MapFilter(v, a, pos);
  if (name == "list") return Value::List(Iterate(v, pos));
  if (name == "reverse") {
    if (v.is_string()) return GetSlice(v, Value(), Value(), Value::Int(-1), pos);
    ValueList items = Iterate(v, pos);
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "sort") return SortFilter(v, a, pos);
  if (name == "unique") {
    ValueList out;
    for (const Value& x : Iterate(v, pos))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return ValuesEqual(x, y); })) out.push_back(x);
    return Value::List(std::move(out));
  }
  if (name == "min" || name == "max") return MinMax(v, name == "max", pos);
  if (name == "sum") {
    Value total = Value::Int(0);
    for (const Value& x : Iterate(v, pos)) {
      if (!x.is_number()) Throw(pos, std::string("sum: cannot add a ") + x.TypeName());
      total = total.kind() == Value::Kind::kInt && x.kind() == Value::Kind::kInt
                  ? Value::Int(static_cast<int64_t>(static_cast<uint64_t>(total.as_int()) + static_cast<uint64_t>(x.as_int())))
                  : Value::Float(total.as_number() + x.as_number());
    }
    return total;
  }
  if (name == "int") return ToIntValue(v, a, pos);
  if (name == "float") return ToFloatValue(v, pos);
  if (name == "abs") {
    if (v.kind() == Value::Kind::kInt) return v.as_int() == INT64_MIN ? v : Value::Int(std::llabs(v.as_int()));
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.as_number()));
    Throw(pos, std::string("abs: expected a number, found ") + v.TypeName());
  }
  if (name == "indent") return Indent(v, a, pos);
  if (name == "wordcount") return Value::Int(static_cast<int64_t>(Split(v.ToString(), nullptr, -1, pos).list().size()));
  Throw(pos, "unknown filter '" + name + "'");
}

bool ApplyTest(const std::string& name, const Value& v, const CallArgs& a, SourcePos pos) {
  using K = Value::Kind;
  const Value* arg = Arg(a, 0, "value");
  auto need_arg = [&]() -> const Value& {
    if (arg == nullptr) Throw(pos, "test '" + name + "' needs an argument");
    return *arg;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.kind() == K::kCallable;
  if (name == "lower") return v.is_string() && Lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && Upper(v.str()) == v.str();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::kInt) Throw(pos, "test '" + name + "' needs an integer, found " + v.TypeName());
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    const Value& d = need_arg();
    if (d.kind() != K::kInt || d.as_int() == 0) Throw(pos, "divisibleby needs a non-zero integer");
    return d.as_int() == -1 || v.as_int() % d.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return ValuesEqual(v, need_arg());
  if (name == "ne" || name == "!=") return !ValuesEqual(v, need_arg());
  if (name == "lt" || name == "lessthan" || name == "<") return CompareValues(v, need_arg(), pos) < 0;
  if (name == "le" || name == "<=") return CompareValues(v, need_arg(), pos) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return CompareValues(v, need_arg(), pos) > 0;
  if (name == "ge" || name == ">=") return CompareValues(v, need_arg(), pos) >= 0;
  if (name == "in") return Contains(need_arg(), v, pos);
  Throw(pos, "unknown test '" + name + "'");
}

namespace {
Value StringMethod(const std::string& s, const std::string& name, const CallArgs& a, SourcePos pos) {
  const std::string what = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::String(StripChars(s, Arg(a, 0, "chars"), name != "rstrip", name != "lstrip", pos));
  if (name == "split") return Split(s, Arg(a, 0, "sep"), IntArg(a, 1, "maxsplit", -1, what, pos), pos);
  if (name == "startswith" || name == "endswith") {
    const Value* p = Arg(a, 0, "prefix");
    if (p == nullptr) Throw(pos, what + ": missing argument");
    return Value::Bool(AffixMatch(s, *p, name == "startswith", pos));
  }
  if (name == "replace")
    return Value::String(Replace(s, StringArg(a, 0, "old", what, pos), StringArg(a, 1, "new", what, pos),
                                 IntArg(a, 2, "count", -1, what, pos), pos));
  if (name == "upper") return Value::String(Upper(s));
  if (name == "lower") return Value::String(Lower(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "find") {
    const size_t at = s.find(StringArg(a, 0, "sub", what, pos));
    return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(at));
  }
  if (name == "count") {
    const std::string& sub = StringArg(a, 0, "sub", what, pos);
    if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Length(s)) + 1);
    int64_t n = 0;
    for (size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) ++n;
    return Value::Int(n);
  }
  if (name == "join") {
    CallArgs j;
    j.positional.push_back(Value::String(s));
    const Value* items = Arg(a, 0, "iterable");
    if (items == nullptr) Throw(pos, what + ": missing argument");
    return JoinFilter(*items, j, pos);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace") {
    bool all = !s.empty();
    for (const char c : s) {
      const unsigned char u = static_cast<unsigned char>(c);
      all = all && (name == "isdigit" ? std::isdigit(u) != 0 : name == "isalpha" ? std::isalpha(u) != 0 : IsWs(c));
    }
    return Value::Bool(all);
  }
  Throw(pos, "unknown string method '" + name + "'");
}
}  // namespace

Value CallMethod(const Value& obj, const std::string& name, const CallArgs& a, SourcePos pos) {
  if (obj.is_string()) return StringMethod(obj.str(), name, a, pos);
  if (obj.is_dict()) {
    if (name == "get") {
      const Value* key = Arg(a, 0, "key");
      if (key == nullptr) Throw(pos, "dict.get: missing the key");
      const Value* v = key->is_string() ? obj.Find(key->str()) : nullptr;
      if (v != nullptr) return *v;
      const Value* d = Arg(a, 1, "default");
      return d ? *d : Value::None();
    }
    ValueList out;
    if (name == "items" || name == "keys" || name == "values") {
      for (const auto& [k, v] : obj.dict()) {
        if (name == "items") out.push_back(Value::List({Value::String(k), v}));
        else out.push_back(name == "keys" ? Value::String(k) : v);
      }
      return Value::List(std::move(out));
    }
    Throw(pos, "unknown dict method '" + name + "'");
  }
  if (obj.is_undefined()) Throw(pos, "cannot call method '" + name + "' of an undefined value");
  Throw(pos, std::string("a ") + obj.TypeName() + " has no method '" + name + "'");
}

}  // namespace nibble::chat
