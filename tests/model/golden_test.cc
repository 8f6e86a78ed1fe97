// End-to-end goldens of the fp forward pass: logits of the shipped models for the prompt in each
// model's goldens/ file, against the tolerance the golden's README states (top-8 ids identical in
// order where neighbouring logits differ by > 1e-3, each logit within 1e-3, L2 norm within 1e-4
// relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nibble/nibble.h>

#include "io/json.h"
#include "test_paths.h"

namespace {

void CheckGolden(const std::string& model_dir) {
  auto golden = nibble::ReadJsonFile(model_dir + "/goldens/logits_once_upon_a_time.json");
  ASSERT_TRUE(golden.ok()) << golden.error().message;
  const auto& g = *golden;
  nibble::LoadOptions lo;
  lo.kv_dtype = nibble::KvDtype::kFp32;  // the goldens are fp32 forwards (bf16 KV: tests/api/kv_memory_test.cc)
  auto model = nibble::Model::Load(model_dir, lo);
  ASSERT_TRUE(model.ok()) << model.error().message;

  // The prompt must tokenize to the golden's prompt_ids (tokenizer + BOS rule).
  auto prompt_ids = (*model)->Tokenize(g["prompt"].get<std::string>());
  ASSERT_TRUE(prompt_ids.ok());
  EXPECT_EQ(*prompt_ids, g["prompt_ids"].get<std::vector<int32_t>>());

  const auto ids = g["sequence_ids"].get<std::vector<int32_t>>();
  auto logits = (*model)->Logits(ids);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  const int64_t vocab = (*model)->info().vocab_size;
  for (const auto& pos : g["positions"]) {
    const int64_t p = pos["position"].get<int64_t>();
    const float* row = logits->data() + p * vocab;
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const auto top_ids = pos["top_ids"].get<std::vector<int32_t>>();
    const auto top_logits = pos["top_logits"].get<std::vector<double>>();
    for (size_t i = 0; i < top_ids.size(); ++i) {
      EXPECT_NEAR(row[top_ids[i]], top_logits[i], 1e-3) << "position " << p << " rank " << i;
      const bool separated = (i == 0 || top_logits[i - 1] - top_logits[i] > 1e-3) &&
                             (i + 1 == top_ids.size() || top_logits[i] - top_logits[i + 1] > 1e-3);
      if (separated) {
        EXPECT_EQ(order[i], top_ids[i]) << "position " << p << " rank " << i;
      }
    }
    double l2 = 0;
    for (int64_t j = 0; j < vocab; ++j) l2 += static_cast<double>(row[j]) * row[j];
    EXPECT_NEAR(std::sqrt(l2), pos["l2_norm"].get<double>(), 1e-4 * pos["l2_norm"].get<double>()) << "position " << p;
    EXPECT_EQ(order[0], pos["argmax"].get<int32_t>()) << "position " << p;
  }
}

TEST(Golden, Stories260KLogits) {
  NIBBLE_NEEDS_SHARED("models/stories260K");
  CheckGolden(nibble_test::SharedModel("stories260K"));
}

TEST(Golden, ProseLlama7mLogits) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m");
  CheckGolden(nibble_test::SharedModel("prose-llama-7m"));
}

// The reparametrised outlier model must produce the same function (its README: bit-identical FP
// outputs); we check the same golden within the same tolerance.
TEST(Golden, ProseLlama7mOutliersMatchesPlainGolden) {
  NIBBLE_NEEDS_SHARED("models/prose-llama-7m", "models/prose-llama-7m-outliers");
  auto golden = nibble::ReadJsonFile(nibble_test::SharedModel("prose-llama-7m") + "/goldens/logits_once_upon_a_time.json");
  ASSERT_TRUE(golden.ok());
  auto plain = nibble::Model::Load(nibble_test::SharedModel("prose-llama-7m"));
  auto outl = nibble::Model::Load(nibble_test::SharedModel("prose-llama-7m-outliers"));
  ASSERT_TRUE(plain.ok() && outl.ok());
  const auto ids = (*golden)["sequence_ids"].get<std::vector<int32_t>>();
  auto a = (*plain)->Logits(ids);
  auto b = (*outl)->Logits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  double worst = 0;
  for (size_t i = 0; i < a->size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>((*a)[i]) - (*b)[i]));
  EXPECT_LT(worst, 1e-3);
}

}  // namespace
