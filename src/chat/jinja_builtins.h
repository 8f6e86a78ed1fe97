// Jinja's built-in filters, tests and the Python methods chat templates call on strings, dicts
// and lists; plus the item / attribute / iteration rules the interpreter shares with them.
// Every function throws JinjaError at `pos` naming what it met (an unknown filter, a wrong type).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace nibble::chat {

/// Largest string (bytes) or list (items) a template may build; beyond it rendering stops with
/// an error rather than exhausting memory.
inline constexpr size_t kMaxValueSize = size_t{16} << 20;
/// Throws when `n` exceeds kMaxValueSize.
void CheckValueSize(size_t n, SourcePos pos);
/// Longest list a template may build (a value is ~100 bytes, so this bounds a list's memory).
inline constexpr size_t kMaxListItems = size_t{1} << 18;
/// Throws when `n` exceeds kMaxListItems.
void CheckListSize(size_t n, SourcePos pos);

/// `value | name(args)`.
Value ApplyFilter(const std::string& name, const Value& value, const CallArgs& args, SourcePos pos);
/// `value is name(args)`.
bool ApplyTest(const std::string& name, const Value& value, const CallArgs& args, SourcePos pos);
/// `object.name(args)`: str / dict / list methods.
Value CallMethod(const Value& object, const std::string& name, const CallArgs& args, SourcePos pos);

/// `object[key]`: dict key, list or string index (negative from the end); undefined when absent.
Value GetItem(const Value& object, const Value& key, SourcePos pos);
/// `object[start:stop:step]` on a list or a string (by character), Python's rules.
Value GetSlice(const Value& object, const Value& start, const Value& stop, const Value& step, SourcePos pos);
/// What a for loop walks: list items, dict keys, string characters; undefined walks nothing.
ValueList Iterate(const Value& v, SourcePos pos);
/// The byte offset where each UTF-8 character of `s` starts (a stray byte is a character of its
/// own), and their number.
std::vector<uint32_t> Utf8Starts(const std::string& s);
size_t Utf8Length(const std::string& s);
/// Ordering for < <= > >=, sort, min, max: numbers with numbers, strings by bytes, lists
/// element-wise; other pairs throw. Returns <0, 0, >0.
int CompareValues(const Value& a, const Value& b, SourcePos pos);
/// `needle in haystack`: substring, list element, dict key.
bool Contains(const Value& haystack, const Value& needle, SourcePos pos);

}  // namespace nibble::chat
