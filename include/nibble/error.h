// Public error values (part of the nibble API; std only).
// Error values for everything caused by input (files, JSON, flags, shapes read from disk).
//
// Design: a small expected-like type so that C++20 code can return either a value or an Error
// whose message says what, where (file / tensor / key / layer), expected and found, and whose
// code says which kind of failure it is (a server answers 400 / 404 / 500 from it, a binding
// raises the matching exception). Context is prepended as the error moves up a layer ("loading
// model dir X: tensor Y: ..."); the code stays. Broken internal contracts are not errors: they
// abort through NIBBLE_CHECK (check.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace nibble {

/// What kind of failure an Error is.
enum class ErrorCode {
  kInvalidArgument,  // a request, flag or value the caller can correct (HTTP 400)
  kNotFound,         // a file, directory or tensor that does not exist (404)
  kUnsupported,      // valid input nibble does not handle: a format, dtype, architecture (400)
  kCorruptInput,     // a file whose bytes or structure are malformed or contradict each other (400)
  kIo,               // the OS failed a read, write, map or rename (500)
  kResourceExhausted,  // a request that needs more memory than allowed (--max_memory, MemAvailable):
                       // refused up front, the message giving bytes needed and allowed (503)
  kCancelled,        // a long call (generate, perplexity, quantize, convert, export-onnx) stopped by its
                     // CancellationToken (<nibble/cancel.h>), rolled back to its last complete step: a session
                     // keeps its position, a writer removes its staging dir, the target untouched (499, nginx's).
                     // Generate returns it only before the first token is streamed (the session
                     // then as before the call); later a cancel ends it Ok, StopReason::kCancelled
  kInternal,         // a bug or an impossible state (500)
};

/// "invalid_argument", "not_found", "unsupported", "corrupt_input", "io", "resource_exhausted",
/// "cancelled", "internal".
inline const char* ErrorCodeName(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCorruptInput: return "corrupt_input";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kCancelled: return "cancelled";
    default: return "internal";
  }
}

/// An input error: a human-readable message naming what, where, expected and found.
struct Error {
  std::string message;
  ErrorCode code = ErrorCode::kInvalidArgument;

  /// Returns a copy with `context + ": "` prepended (e.g. the file being loaded), same code.
  Error WithContext(const std::string& context) const { return Error{context + ": " + message, code}; }
  /// Returns a copy with another code.
  Error WithCode(ErrorCode c) const { return Error{message, c}; }
};

/// Either a T or an Error. Access the value only after checking ok(); value() on an error aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { Ensure(); return std::get<0>(v_); }
  const T& value() const& { Ensure(); return std::get<0>(v_); }
  T&& value() && { Ensure(); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  void Ensure() const {
    if (v_.index() != 0) {
      std::fprintf(stderr, "nibble: internal error: value() on error result: %s\n",
                   std::get<1>(v_).message.c_str());
      std::abort();
    }
  }
  std::variant<T, Error> v_;
};

/// A Result without a value: ok, or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT: implicit on purpose
  static Status Ok() { return Status(); }
  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

inline void AppendPiece(std::string& s, const std::string& v) { s += v; }
inline void AppendPiece(std::string& s, std::string_view v) { s += v; }
inline void AppendPiece(std::string& s, const char* v) { s += v; }
inline void AppendPiece(std::string& s, char v) { s += v; }
template <typename N>
  requires std::is_arithmetic_v<N>
inline void AppendPiece(std::string& s, N v) { s += std::to_string(v); }

/// Builds an Error from string pieces: MakeError("file ", path, ": expected ", a, ", found ", b).
/// The code is kInvalidArgument; MakeErrorCode names another.
template <typename... Args>
Error MakeError(Args&&... args) {
  std::string s;
  (AppendPiece(s, std::forward<Args>(args)), ...);
  return Error{std::move(s)};
}

template <typename... Args>
Error MakeErrorCode(ErrorCode code, Args&&... args) {
  Error e = MakeError(std::forward<Args>(args)...);
  e.code = code;
  return e;
}


}  // namespace nibble

