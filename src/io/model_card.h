// The model card (README.md) of a checkpoint nibble writes: the input's card with a short note of
// what nibble did to the weights at its top, as AMD Quark and llm-compressor add one; the note
// alone when the input has no card. A YAML front-matter block (--- ... ---, the Hub's metadata)
// stays first, so the card's metadata still parses.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace nibble {

struct ModelCardNote {
  std::string heading;  // e.g. "Quantized with nibble 0.1.0"
  std::string summary;  // one sentence: the command and what the weights are now
  std::vector<std::pair<std::string, std::string>> items;  // "algorithm" -> "AWQ", ...
};

/// Quantization schemes with how many linears use each: "uint4 per_group g128 (14 linears); ...".
std::string SchemeCounts(const std::map<std::string, int64_t>& linears_per_scheme);

/// The note as Markdown: a level-2 heading, the summary, one bullet per item.
std::string RenderModelCardNote(const ModelCardNote& note);

/// `card` (may be empty) with the rendered `note` inserted after its front matter, or at its top,
/// and a rule between the note and the card.
std::string ModelCardWithNote(const std::string& card, const ModelCardNote& note);

}  // namespace nibble
