// Public API: the stop-string matcher over streamed text.
#include <nibble/stop_strings.h>

#include <algorithm>

namespace nibble {

std::string StopStringMatcher::Push(std::string_view piece) {
  if (stopped()) return "";
  pending_.append(piece);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) first = at, matched_ = s;
  }
  if (first != std::string::npos) {
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that a stop string starts with; it may still complete one.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t len = std::min(pending_.size(), s.size() - 1); len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace nibble
