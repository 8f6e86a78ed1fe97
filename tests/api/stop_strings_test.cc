// The stop-string matcher (`generate --stop`, chat end-of-turn markers) over streamed pieces:
// the text before a stop string is passed on, the stop string and what follows never are, also
// when the stop string arrives split over pieces.
#include <nibble/stop_strings.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace nibble {
namespace {

// Everything the filter passes on for `pieces`, the held-back tail flushed at the end.
std::string Shown(StopStringMatcher& f, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += f.Push(p);
  return out + f.Flush();
}

TEST(StopStrings, StopSplitOverPiecesIsNotShown) {
  StopStringMatcher f({"STOP"});
  EXPECT_EQ(f.Push("Hello wo"), "Hello wo");
  EXPECT_EQ(f.Push("rld. ST"), "rld. ");  // "ST" may start the stop string: held back
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.Push("OP and more"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.matched(), "STOP");
  EXPECT_EQ(f.Push("later"), "");
  EXPECT_EQ(f.Flush(), "");
}

TEST(StopStrings, StopOverManySinglePieces) {
  StopStringMatcher f({"\n\n"});
  EXPECT_EQ(Shown(f, {"a", "\n", "b", "\n", "\n", "c"}), "a\nb");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStrings, TextAroundAStopInOnePiece) {
  StopStringMatcher f({"###"});
  EXPECT_EQ(f.Push("answer 42### next question"), "answer 42");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStrings, AFalseStartIsReleased) {
  StopStringMatcher f({"STOP"});
  EXPECT_EQ(f.Push("ST"), "");
  EXPECT_EQ(f.Push("ART"), "START");
  EXPECT_EQ(f.Push("x STO"), "x ");
  EXPECT_EQ(f.Flush(), "STO");  // generation ended without the stop string: nothing is lost
  EXPECT_FALSE(f.stopped());
}

TEST(StopStrings, TheEarliestOfSeveralStopsWins) {
  StopStringMatcher f({"world", "lo"});
  EXPECT_EQ(Shown(f, {"hel", "lo world"}), "hel");
  EXPECT_EQ(f.matched(), "lo");
}

TEST(StopStrings, HoldsBackOnlyWhatCanStillStartAStop) {
  StopStringMatcher f({"abc", "xy"});
  EXPECT_EQ(f.Push("zzab"), "zz");  // "ab" may become "abc"
  EXPECT_EQ(f.Push("x"), "ab");     // "abx" cannot, but "x" may start "xy"
  EXPECT_EQ(f.Push("z"), "xz");
  EXPECT_FALSE(f.stopped());
}

}  // namespace
}  // namespace nibble
