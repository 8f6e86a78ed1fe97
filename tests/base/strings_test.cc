// Edit distance and the "did you mean" choice used for misspelt flags and config keys.
#include "base/strings.h"

#include <gtest/gtest.h>

namespace nibble {
namespace {

TEST(Strings, EditDistance) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("", "ab"), 2u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("exlcude", "exclude"), 2u);  // a transposition is two edits
  EXPECT_EQ(EditDistance("group_size", "groupsize"), 1u);
}

TEST(Strings, ClosestOfWithinTheBound) {
  const std::vector<std::string> keys = {"exclude", "export", "version"};
  EXPECT_EQ(ClosestOf("exlcude", keys), "exclude");
  EXPECT_EQ(ClosestOf("exprt", keys), "export");
  EXPECT_EQ(ClosestOf("zzzzzzzzzz", keys), "");  // 10 letters: more than max(2, 10/3) edits away
  EXPECT_EQ(ClosestOf("x", {}), "");
}

TEST(Strings, PrintableBytesEscapesAllButPrintableAscii) {
  EXPECT_EQ(PrintableBytes("last read: 'ab~'"), "last read: 'ab~'");
  EXPECT_EQ(PrintableBytes(std::string("\x89PNG\r\n\x1a\n\0\x7f\xc3\xa9", 12)), "\\x89PNG\\x0D\\x0A\\x1A\\x0A\\x00\\x7F\\xC3\\xA9");
  EXPECT_EQ(PrintableBytes(""), "");
}

}  // namespace
}  // namespace nibble
