// Stop strings over streamed text (`generate --stop`, a chat template's end-of-turn markers, an
// OpenAI-style `stop` list): text is released as soon as it can no longer be the start of a stop
// string; a stop string and everything after it never are, even when it arrives split over
// several pieces (tokens). Generate applies it to GenerateOptions::stop; it is public for front
// ends that filter text of their own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nibble {

class StopStringMatcher {
 public:
  /// `stops` must not contain an empty string (callers refuse one: it would match at once).
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  /// Takes the next piece of text; returns what may be shown now (possibly ""): everything but
  /// the longest tail that some stop string starts with, which is held back. Once a stop string
  /// is complete, returns the text before it (the earliest match wins) and stopped() turns true;
  /// later pieces return "".
  std::string Push(std::string_view piece);
  /// The text held back, for when generation ends without a stop string ("" after a stop).
  std::string Flush();
  /// The stop reason: true once a stop string ended the text.
  bool stopped() const { return !matched_.empty(); }
  /// The stop string that ended the text ("" while none did).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // a tail that is a proper prefix of some stop string
  std::string matched_;
};

}  // namespace nibble
