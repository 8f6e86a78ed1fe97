#include "support/text.h"

#include "base/strings.h"

namespace nibble_cli {

std::string ClosestOf(const std::string& word, const std::vector<std::string>& candidates) {
  return nibble::ClosestOf(word, candidates);
}

}  // namespace nibble_cli
