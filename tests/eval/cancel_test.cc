// Cancelling perplexity and the float-vs-quantized comparison (PerplexityOptions::cancel,
// CompareOptions::cancel): a token cancelled before the call or from another thread during it
// gives kCancelled after the window being run, leaves no saved-logits file, and leaves the model
// usable: the next run gives the perplexity of a run never cancelled.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "cancel_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

std::string Text() {
  std::string t;
  for (int i = 0; i < 40; ++i)
    t += "The old lighthouse keeper walked along the shore every morning, counting the boats that came back. ";
  return t;
}

std::unique_ptr<nibble::Model> LoadEmbedded() {
  auto m = nibble::Model::Load(nibble_test::EmbeddedModel());
  if (!m.ok()) ADD_FAILURE() << m.error().message;
  return m.ok() ? std::move(m).value() : nullptr;
}

size_t Entries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

nibble::PerplexityOptions Options(const std::string& save_logits) {
  nibble::PerplexityOptions o;
  o.seq_len = 32;
  o.max_windows = 4;
  o.save_logits = save_logits;
  return o;
}

TEST(CancelPerplexity, CancelledBeforeTheCallRunsNothingAndSavesNothing) {
  auto model = LoadEmbedded();
  ASSERT_NE(model, nullptr);
  nibble_test::TempDir tmp;
  nibble::CancellationToken token;
  token.Cancel();
  nibble::PerplexityOptions o = Options(tmp.sub("logits.bin"));
  o.cancel = &token;
  int64_t windows = 0;
  o.on_window = [&](int64_t, int64_t, double) { ++windows; };
  auto r = nibble::EvaluatePerplexity(*model, Text(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, nibble::ErrorCode::kCancelled) << r.error().message;
  EXPECT_NE(r.error().message.find("cancelled: perplexity before window 1 of 4"), std::string::npos) << r.error().message;
  EXPECT_EQ(windows, 0);
  EXPECT_EQ(Entries(tmp.path()), 0u) << "a saved-logits file or its temporary was left";
}

TEST(CancelPerplexity, CancelledFromAnotherThreadStopsAfterTheWindowAndTheModelRunsOn) {
  auto model = LoadEmbedded();
  ASSERT_NE(model, nullptr);
  nibble_test::TempDir tmp;
  auto full = nibble::EvaluatePerplexity(*model, Text(), Options(""));
  ASSERT_TRUE(full.ok()) << full.error().message;
  ASSERT_EQ(full->n_windows, 4);

  nibble::CancellationToken token;
  nibble_test::CancelFromThread canceller(token);
  nibble::PerplexityOptions o = Options(tmp.sub("logits.bin"));
  o.cancel = &token;
  int64_t windows = 0;
  o.on_window = [&](int64_t done, int64_t, double) {
    windows = done;
    if (done == 2) canceller.Trigger();
  };
  auto r = nibble::EvaluatePerplexity(*model, Text(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, nibble::ErrorCode::kCancelled) << r.error().message;
  EXPECT_NE(r.error().message.find("window 3 of 4"), std::string::npos) << r.error().message;
  EXPECT_EQ(windows, 2);
  EXPECT_EQ(Entries(tmp.path()), 0u) << "a saved-logits file or its temporary was left";

  auto again = nibble::EvaluatePerplexity(*model, Text(), Options(""));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->ppl, full->ppl);
}

TEST(CancelPerplexity, CompareCancelledFromAnotherThreadSavesNoBaseLogits) {
  auto base = LoadEmbedded(), q = LoadEmbedded();
  ASSERT_NE(base, nullptr);
  ASSERT_NE(q, nullptr);
  nibble_test::TempDir tmp;
  nibble::CompareOptions o;
  o.seq_len = 32;
  o.max_windows = 4;
  o.save_logits = tmp.sub("logits.bin");
  nibble::CancellationToken token;
  o.cancel = &token;
  {
    nibble::CancellationToken before;
    before.Cancel();
    nibble::CompareOptions pre = o;
    pre.cancel = &before;
    auto r = nibble::CompareModels(*base, {q.get()}, Text(), pre);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, nibble::ErrorCode::kCancelled) << r.error().message;
    EXPECT_EQ(Entries(tmp.path()), 0u);
  }
  nibble_test::CancelFromThread canceller(token);
  int64_t windows = 0;
  o.on_window = [&](int64_t done, int64_t, double) {
    windows = done;
    canceller.Trigger();
  };
  auto r = nibble::CompareModels(*base, {q.get()}, Text(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, nibble::ErrorCode::kCancelled) << r.error().message;
  EXPECT_EQ(windows, 1);
  EXPECT_EQ(Entries(tmp.path()), 0u) << "the base's saved logits were left half-written";
}

}  // namespace
