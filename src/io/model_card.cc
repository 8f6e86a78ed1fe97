#include "io/model_card.h"

namespace nibble {

std::string SchemeCounts(const std::map<std::string, int64_t>& linears_per_scheme) {
  std::string s;
  for (const auto& [scheme, count] : linears_per_scheme)
    s += (s.empty() ? "" : "; ") + scheme + " (" + std::to_string(count) + (count == 1 ? " linear)" : " linears)");
  return s;
}

std::string RenderModelCardNote(const ModelCardNote& note) {
  std::string s = "## " + note.heading + "\n\n" + note.summary + "\n\n";
  for (const auto& [key, value] : note.items) s += "- " + key + ": " + value + "\n";
  return s;
}

namespace {

// Bytes of a leading YAML front-matter block ("---\n" ... "\n---\n"); 0 when there is none.
size_t FrontMatterEnd(const std::string& card) {
  if (card.rfind("---\n", 0) != 0 && card.rfind("---\r\n", 0) != 0) return 0;
  size_t pos = card.find('\n') + 1;
  while (pos < card.size()) {
    size_t eol = card.find('\n', pos);
    const size_t end = eol == std::string::npos ? card.size() : eol + 1;
    std::string line = card.substr(pos, end - pos);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line == "---") return end;
    pos = end;
  }
  return 0;  // unterminated: not front matter, the note goes first
}

}  // namespace

std::string ModelCardWithNote(const std::string& card, const ModelCardNote& note) {
  const size_t at = FrontMatterEnd(card);
  std::string head = card.substr(0, at);
  if (at > 0) head += "\n";
  const std::string rest = card.substr(at);
  // A rule parts the note from the original card.
  return head + RenderModelCardNote(note) + (rest.empty() ? "" : "\n---\n\n" + rest);
}

}  // namespace nibble
