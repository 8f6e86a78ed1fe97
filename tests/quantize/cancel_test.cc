// Cancelling quantize (RTN and the calibrated pipeline) and convert through their requests'
// CancellationToken: cancelled before the call or from another thread during it, each returns
// kCancelled at its next check and leaves nothing behind: no output directory, no staging
// directory, and an existing output (--overwrite) byte for byte as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "cancel_util.h"
#include "test_paths.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::TempDir;

// The names in `dir` (a staging directory ".out.nibble-tmp-<pid>" would show here).
std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

nibble::QuantizeRequest Rtn(const std::string& out) {
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = out;
  return r;
}

void ExpectCancelled(const nibble::Error& e, const std::string& out) {
  EXPECT_EQ(e.code, nibble::ErrorCode::kCancelled) << e.message;
  EXPECT_NE(e.message.find("cancelled: "), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("nothing was written to " + out), std::string::npos) << e.message;
}

TEST(CancelQuantize, RtnCancelledBeforeTheCallWritesNothing) {
  TempDir tmp;
  nibble::CancellationToken token;
  token.Cancel();
  nibble::QuantizeRequest r = Rtn(tmp.sub("out"));
  r.cancel = &token;
  auto s = nibble::Quantize(r);
  ASSERT_FALSE(s.ok());
  ExpectCancelled(s.error(), r.output_dir);
  EXPECT_EQ(Listing(tmp.path()), std::vector<std::string>{});
}

// Cancelled after the third linear is written into the staging directory: the next tensor's check
// stops the export and the staging directory goes; an existing output under --overwrite stays.
TEST(CancelQuantize, RtnCancelledFromAnotherThreadRemovesTheStagingDirAndKeepsTheOldOutput) {
  TempDir tmp;
  for (bool existing : {false, true}) {
    SCOPED_TRACE(existing ? "over an existing output" : "no output yet");
    std::map<std::string, std::string> before;
    if (existing) {
      ASSERT_TRUE(nibble::Quantize(Rtn(tmp.sub("out"))).ok());
      before = nibble_test::DirBytes(tmp.sub("out"));
    }
    nibble::CancellationToken token;
    nibble_test::CancelFromThread canceller(token);
    nibble::QuantizeRequest r = Rtn(tmp.sub("out"));
    r.overwrite = existing;
    r.cancel = &token;
    int64_t last = 0, total = 0;
    r.progress = [&](int64_t done, int64_t n) {
      last = done, total = n;
      if (done == 3) canceller.Trigger();
    };
    auto s = nibble::Quantize(r);
    ASSERT_FALSE(s.ok());
    ExpectCancelled(s.error(), r.output_dir);
    EXPECT_EQ(last, 3);
    EXPECT_GT(total, 3);
    EXPECT_EQ(Listing(tmp.path()), existing ? std::vector<std::string>{"out"} : std::vector<std::string>{});
    if (existing) {
      EXPECT_EQ(nibble_test::DirBytes(tmp.sub("out")), before);
    }
  }
}

// GPTQ on the calibrated pipeline: pre-cancelled, and cancelled from another thread at the second
// Hessian of layer 1 (a step inside the layer: no layer completes) and at the end of layer 1.
TEST(CancelQuantize, GptqCancelledAtAStepOrALayerWritesNothing) {
  NIBBLE_NEEDS_SHARED("data/tinyshakespeare.txt");
  TempDir tmp;
  const std::string calib = nibble_test::TinyCalibFile(tmp.sub("calib.txt"));
  const std::vector<std::string> inputs = {"calib.txt"};
  {
    nibble::CancellationToken token;
    token.Cancel();
    auto r = nibble_test::TinyCalibRequest("gptq", nibble_test::EmbeddedModel(), tmp.sub("out"), calib);
    r.cancel = &token;
    auto s = nibble::Quantize(r);
    ASSERT_FALSE(s.ok());
    ExpectCancelled(s.error(), r.output_dir);
    EXPECT_NE(s.error().message.find("layer 1 of 6"), std::string::npos) << s.error().message;
    EXPECT_EQ(Listing(tmp.path()), inputs);
  }
  for (int64_t at_step : {2, 5}) {  // 5 steps per layer: 4 Hessians, then the layer
    SCOPED_TRACE("cancelled at step " + std::to_string(at_step));
    nibble::CancellationToken token;
    nibble_test::CancelFromThread canceller(token);
    auto r = nibble_test::TinyCalibRequest("gptq", nibble_test::EmbeddedModel(), tmp.sub("out"), calib);
    r.cancel = &token;
    int64_t last = 0, layers = 0;
    r.progress = [&](int64_t done, int64_t) {
      last = done;
      if (done == at_step) canceller.Trigger();
    };
    r.on_layer = [&](int64_t layer, int64_t) { layers = layer; };
    auto s = nibble::Quantize(r);
    ASSERT_FALSE(s.ok());
    ExpectCancelled(s.error(), r.output_dir);
    EXPECT_EQ(last, at_step);
    EXPECT_EQ(layers, at_step == 5 ? 1 : 0);
    EXPECT_EQ(Listing(tmp.path()), inputs);
  }
}

// convert: pre-cancelled, and cancelled once the whole output is staged (its notes are reported
// just before the commit): the complete staging directory is removed, nothing is renamed.
TEST(CancelQuantize, ConvertCancelledBeforeOrJustBeforeTheCommitWritesNothing) {
  TempDir tmp;
  ASSERT_TRUE(nibble::Quantize(Rtn(tmp.sub("q"))).ok());
  nibble::ConvertRequest r;
  r.input_dir = tmp.sub("q");
  r.output_dir = tmp.sub("ct");
  r.to = "compressed-tensors";
  r.gptq_format = "v2";  // not used by compressed-tensors: a warning through on_message
  {
    nibble::CancellationToken token;
    token.Cancel();
    r.cancel = &token;
    auto s = nibble::Convert(r);
    ASSERT_FALSE(s.ok());
    ExpectCancelled(s.error(), r.output_dir);
    EXPECT_EQ(Listing(tmp.path()), std::vector<std::string>{"q"});
  }
  nibble::CancellationToken token;
  nibble_test::CancelFromThread canceller(token);
  r.cancel = &token;
  r.on_message = [&](const std::string&) { canceller.Trigger(); };
  auto s = nibble::Convert(r);
  ASSERT_TRUE(canceller.triggered());
  ASSERT_FALSE(s.ok());
  ExpectCancelled(s.error(), r.output_dir);
  EXPECT_NE(s.error().message.find("before the output was committed"), std::string::npos) << s.error().message;
  EXPECT_EQ(Listing(tmp.path()), std::vector<std::string>{"q"});
  // Not cancelled, the same request writes the output (the test above could fail).
  r.cancel = nullptr;
  r.on_message = nullptr;
  ASSERT_TRUE(nibble::Convert(r).ok());
  EXPECT_EQ(Listing(tmp.path()), (std::vector<std::string>{"ct", "q"}));
}

}  // namespace
