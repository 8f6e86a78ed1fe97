// Stop strings over streamed text (`nibble generate --stop`): text is passed on as soon as it can
// no longer be the start of a stop string; a stop string and everything after it never are, even
// when it arrives split over several pieces.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nibble_cli {

class StopStringFilter {
 public:
  /// `stops` must not contain an empty string.
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  /// Takes the next piece of text; returns what may be shown now (possibly ""). Once a stop
  /// string is complete, returns the text before it and stopped() turns true.
  std::string Push(std::string_view piece);
  /// The text held back, for the end of generation ("" after a stop).
  std::string Flush();
  bool stopped() const { return !matched_.empty(); }
  /// The stop string that ended generation ("" while none did).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // a tail that is a proper prefix of some stop string
  std::string matched_;
};

}  // namespace nibble_cli
