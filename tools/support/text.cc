#include "support/text.h"

#include "base/strings.h"

namespace nibble_cli {

std::string ClosestOf(const std::string& word, const std::vector<std::string>& candidates) {
  return nibble::ClosestOf(word, candidates);
}

std::string Plural(long long n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace nibble_cli
