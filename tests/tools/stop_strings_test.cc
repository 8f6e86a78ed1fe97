// `generate --stop` over streamed pieces: the text before a stop string is passed on, the stop
// string and what follows never are, also when the stop string arrives split over pieces.
#include "support/stop_strings.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace nibble_cli {
namespace {

// Everything the filter passes on for `pieces`, the held-back tail flushed at the end.
std::string Shown(StopStringFilter& f, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += f.Push(p);
  return out + f.Flush();
}

TEST(StopStrings, StopSplitOverPiecesIsNotShown) {
  StopStringFilter f({"STOP"});
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
  StopStringFilter f({"\n\n"});
  EXPECT_EQ(Shown(f, {"a", "\n", "b", "\n", "\n", "c"}), "a\nb");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStrings, TextAroundAStopInOnePiece) {
  StopStringFilter f({"###"});
  EXPECT_EQ(f.Push("answer 42### next question"), "answer 42");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStrings, AFalseStartIsReleased) {
  StopStringFilter f({"STOP"});
  EXPECT_EQ(f.Push("ST"), "");
  EXPECT_EQ(f.Push("ART"), "START");
  EXPECT_EQ(f.Push("x STO"), "x ");
  EXPECT_EQ(f.Flush(), "STO");  // generation ended without the stop string: nothing is lost
  EXPECT_FALSE(f.stopped());
}

TEST(StopStrings, TheEarliestOfSeveralStopsWins) {
  StopStringFilter f({"world", "lo"});
  EXPECT_EQ(Shown(f, {"hel", "lo world"}), "hel");
  EXPECT_EQ(f.matched(), "lo");
}

TEST(StopStrings, HoldsBackOnlyWhatCanStillStartAStop) {
  StopStringFilter f({"abc", "xy"});
  EXPECT_EQ(f.Push("zzab"), "zz");  // "ab" may become "abc"
  EXPECT_EQ(f.Push("x"), "ab");     // "abx" cannot, but "x" may start "xy"
  EXPECT_EQ(f.Push("z"), "xz");
  EXPECT_FALSE(f.stopped());
}

}  // namespace
}  // namespace nibble_cli
