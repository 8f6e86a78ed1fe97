#include "io/model_card.h"

#include <gtest/gtest.h>

namespace nibble {
namespace {

ModelCardNote Note() {
  ModelCardNote n;
  n.heading = "Quantized with nibble 9.9";
  n.summary = "What was done.";
  n.items = {{"algorithm", "RTN"}, {"scheme", "uint4 per_group g128 (3 linears)"}};
  return n;
}

TEST(ModelCard, NoteGoesFirstThenARuleThenTheCard) {
  EXPECT_EQ(ModelCardWithNote("# Title\n\nBody.\n", Note()),
            "## Quantized with nibble 9.9\n\nWhat was done.\n\n- algorithm: RTN\n- scheme: uint4 per_group g128 (3 linears)\n"
            "\n---\n\n# Title\n\nBody.\n");
}

TEST(ModelCard, FrontMatterStaysFirst) {
  const std::string card = "---\nlicense: mit\nbase_model: x\n---\n# Title\n";
  const std::string out = ModelCardWithNote(card, Note());
  EXPECT_EQ(out.rfind("---\nlicense: mit\nbase_model: x\n---\n\n## Quantized with nibble 9.9\n", 0), 0u) << out;
  const std::string tail = "- scheme: uint4 per_group g128 (3 linears)\n\n---\n\n# Title\n";
  EXPECT_EQ(out.substr(out.size() - tail.size()), tail) << out;
}

TEST(ModelCard, WithoutACardTheNoteAlone) {
  EXPECT_EQ(ModelCardWithNote("", Note()), RenderModelCardNote(Note()));
  EXPECT_EQ(RenderModelCardNote(Note()).find("---"), std::string::npos);
}

TEST(ModelCard, UnterminatedFrontMatterIsNotFrontMatter) {
  const std::string card = "---\nnot closed\n";
  EXPECT_EQ(ModelCardWithNote(card, Note()).rfind("## Quantized", 0), 0u);
}

TEST(ModelCard, SchemeCountsSaysLinearOrLinears) {
  EXPECT_EQ(SchemeCounts({{"int4 per_group g32", 1}, {"uint4 per_group g128", 14}}),
            "int4 per_group g32 (1 linear); uint4 per_group g128 (14 linears)");
}

}  // namespace
}  // namespace nibble
