// Perplexity does not depend on the thread count: each token's NLL is computed on any thread and
// the sums run in token order, so 1, 2 and 3 threads give the same bits (prose-llama-7m, dense,
// and its int4 export, whose decode loops run on the claim pool).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "test_paths.h"
#include "test_util.h"

namespace {

std::string LighthouseText() {
  std::string t;
  for (int i = 0; i < 40; ++i)
    t += "The old lighthouse keeper walked along the shore every morning, counting the boats that came back. ";
  return t;
}

void ExpectSameForAnyThreadCount(const std::string& dir) {
  auto m = nibble::Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  nibble::PerplexityOptions o;
  o.seq_len = 64;
  o.max_windows = 6;
  o.threads = 1;
  const auto one = nibble::EvaluatePerplexity(**m, LighthouseText(), o);
  ASSERT_TRUE(one.ok()) << one.error().message;
  for (int threads : {2, 3}) {
    o.threads = threads;
    const auto many = nibble::EvaluatePerplexity(**m, LighthouseText(), o);
    ASSERT_TRUE(many.ok()) << many.error().message;
    EXPECT_EQ(many->mean_nll, one->mean_nll) << dir << ", " << threads << " threads";
    EXPECT_EQ(many->ppl_stderr, one->ppl_stderr) << dir << ", " << threads << " threads";
  }
}

TEST(PerplexityThreads, SameBitsForOneTwoAndThreeThreads) {
  ExpectSameForAnyThreadCount(nibble_test::EmbeddedModel());
  nibble_test::TempDir tmp;
  ExpectSameForAnyThreadCount(nibble_test::QuantizedEmbeddedModel(tmp));
}

}  // namespace
