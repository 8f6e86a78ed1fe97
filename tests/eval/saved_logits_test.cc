// Saved logits and the llama-perplexity statistics: the numbers perplexity and compare report are
// recomputed here from the saved logits files alone (own parser, own log-softmax in double, own
// quantiles); a saved base gives the same comparison as running it; a file that does not match
// the run is an error naming the file and what differs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nibble/nibble.h>

#include "test_paths.h"

namespace {

// A saved-logits file as docs/FORMATS.md describes it, parsed without the library.
struct Saved {
  uint32_t version = 0, vocab = 0;
  uint64_t seq_len = 0, windows = 0, text_tokens = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [windows][seq_len - 1][vocab]
  const float* Row(uint64_t w, uint64_t i) const { return logits.data() + (w * (seq_len - 1) + i) * vocab; }
};

Saved ReadSaved(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  f.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "NIBLOGIT");
  Saved s;
  f.read(reinterpret_cast<char*>(&s.version), 4);
  f.read(reinterpret_cast<char*>(&s.vocab), 4);
  f.read(reinterpret_cast<char*>(&s.seq_len), 8);
  f.read(reinterpret_cast<char*>(&s.windows), 8);
  f.read(reinterpret_cast<char*>(&s.text_tokens), 8);
  s.tokens.resize(s.windows * s.seq_len);
  f.read(reinterpret_cast<char*>(s.tokens.data()), static_cast<std::streamsize>(4 * s.tokens.size()));
  s.logits.resize(s.windows * (s.seq_len - 1) * s.vocab);
  f.read(reinterpret_cast<char*>(s.logits.data()), static_cast<std::streamsize>(4 * s.logits.size()));
  EXPECT_TRUE(f.good());
  EXPECT_EQ(f.peek(), EOF);
  return s;
}

std::vector<double> LogSoftmax(const float* row, uint32_t n) {
  double mx = row[0];
  for (uint32_t j = 1; j < n; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double sum = 0;
  for (uint32_t j = 0; j < n; ++j) sum += std::exp(row[j] - mx);
  std::vector<double> out(n);
  for (uint32_t j = 0; j < n; ++j) out[j] = row[j] - mx - std::log(sum);
  return out;
}

double Percentile(std::vector<double> v, double q) {  // linear between the closest ranks
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (pos - static_cast<double>(i)) * (v[i + 1] - v[i]);
}

std::string ReadText() {
  std::ifstream in(nibble_test::SharedData("wikitext-2-raw-test.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().substr(0, 30000);
}

class SavedLogitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string("/tmp/nibble-saved-logits-" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
    nibble::QuantizeRequest r;
    r.model_dir = nibble_test::SharedModel("stories260K");
    r.output_dir = *dir_ + "/q";
    r.group_size = 32;
    r.misaligned = "per_channel";
    r.overwrite = true;
    ASSERT_TRUE(nibble::Quantize(r).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    auto fp = nibble::Model::Load(nibble_test::SharedModel("stories260K"));
    auto q = nibble::Model::Load(*dir_ + "/q");
    ASSERT_TRUE(fp.ok() && q.ok());
    fp_ = std::move(*fp);
    q_ = std::move(*q);
    text_ = ReadText();
    opt_.seq_len = 128;
    opt_.max_windows = 3;
    opt_.threads = 1;
  }
  std::string Path(const std::string& name) const { return *dir_ + "/" + name; }
  // The compare error for the base saved at `file` under `opt`.
  std::string CompareError(const std::string& file, const nibble::CompareOptions& opt, const std::string& text,
                           const nibble::Model* m = nullptr) {
    auto c = nibble::CompareWithSavedLogits(file, {m != nullptr ? m : q_.get()}, text, opt);
    EXPECT_FALSE(c.ok());
    return c.ok() ? "" : c.error().message;
  }

  static std::string* dir_;
  std::unique_ptr<nibble::Model> fp_, q_;
  std::string text_;
  nibble::CompareOptions opt_;
};
std::string* SavedLogitsTest::dir_ = nullptr;

TEST_F(SavedLogitsTest, StatisticsMatchAnIndependentComputationFromTheSavedLogits) {
  nibble::PerplexityOptions po;
  po.seq_len = 128;
  po.max_windows = 3;
  po.threads = 1;
  po.save_logits = Path("fp.bin");
  auto pf = nibble::EvaluatePerplexity(*fp_, text_, po);
  ASSERT_TRUE(pf.ok()) << pf.error().message;
  po.save_logits = Path("q.bin");
  auto pq = nibble::EvaluatePerplexity(*q_, text_, po);
  ASSERT_TRUE(pq.ok()) << pq.error().message;
  auto c = nibble::CompareModels(*fp_, {q_.get()}, text_, opt_);
  ASSERT_TRUE(c.ok()) << c.error().message;

  const Saved f = ReadSaved(Path("fp.bin")), q = ReadSaved(Path("q.bin"));
  ASSERT_EQ(f.vocab, 512u);
  ASSERT_EQ(f.windows, 3u);
  ASSERT_EQ(f.tokens, q.tokens);
  std::vector<double> nll, kl;
  int64_t same = 0;
  for (uint64_t w = 0; w < f.windows; ++w)
    for (uint64_t i = 0; i + 1 < f.seq_len; ++i) {
      const std::vector<double> lp = LogSoftmax(f.Row(w, i), f.vocab), lq = LogSoftmax(q.Row(w, i), q.vocab);
      nll.push_back(-lp[static_cast<size_t>(f.tokens[w * f.seq_len + i + 1])]);
      double k = 0;
      for (uint32_t j = 0; j < f.vocab; ++j) k += std::exp(lp[j]) * (lp[j] - lq[j]);
      kl.push_back(k);
      same += std::max_element(lp.begin(), lp.end()) - lp.begin() == std::max_element(lq.begin(), lq.end()) - lq.begin();
    }
  const double n = static_cast<double>(nll.size());
  ASSERT_EQ(n, 3.0 * 127);
  auto mean_err = [n](const std::vector<double>& v, double* err) {
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    *err = std::sqrt((s2 / n - (s / n) * (s / n)) / (n - 1));
    return s / n;
  };
  double nll_err, kl_err;
  const double ppl = std::exp(mean_err(nll, &nll_err));
  EXPECT_NEAR(pf->ppl, ppl, ppl * 1e-6);
  EXPECT_NEAR(pf->ppl_stderr, ppl * nll_err, ppl * nll_err * 1e-4);
  EXPECT_GT(pf->ppl_stderr, 0);
  EXPECT_DOUBLE_EQ(c->base.ppl, pf->ppl);
  EXPECT_DOUBLE_EQ(c->base.ppl_stderr, pf->ppl_stderr);
  EXPECT_DOUBLE_EQ(c->rows[0].perplexity.ppl, pq->ppl);

  const nibble::ComparisonRow& r = c->rows[0];
  const double mean_kl = mean_err(kl, &kl_err), tol = 1e-7;
  EXPECT_GT(mean_kl, 1e-4);
  EXPECT_NEAR(r.mean_kld, mean_kl, tol + 1e-4 * mean_kl);
  EXPECT_NEAR(r.mean_kld_error, kl_err, tol + 1e-3 * kl_err);
  EXPECT_NEAR(r.median_kld, Percentile(kl, 0.5), tol + 1e-4 * r.median_kld);
  EXPECT_NEAR(r.kld_p90, Percentile(kl, 0.9), tol + 1e-4 * r.kld_p90);
  EXPECT_NEAR(r.kld_p99, Percentile(kl, 0.99), tol + 1e-4 * r.kld_p99);
  EXPECT_NEAR(r.kld_p999, Percentile(kl, 0.999), tol + 1e-4 * r.kld_p999);
  EXPECT_NEAR(r.max_kld, *std::max_element(kl.begin(), kl.end()), tol + 1e-4 * r.max_kld);
  const double p = static_cast<double>(same) / n;
  EXPECT_DOUBLE_EQ(r.top1_agreement, p);
  EXPECT_NEAR(r.top1_agreement_error, std::sqrt(p * (1 - p) / (n - 1)), 1e-12);
}

TEST_F(SavedLogitsTest, SavedBaseGivesTheSameComparisonAsRunningIt) {
  nibble::CompareOptions save = opt_;
  save.save_logits = Path("");  // a directory: DIR/nibble-logits.bin
  auto live = nibble::CompareModels(*fp_, {q_.get()}, text_, save);
  ASSERT_TRUE(live.ok()) << live.error().message;
  ASSERT_TRUE(std::filesystem::exists(Path(nibble::kSavedLogitsFileName)));
  EXPECT_EQ(nibble::FindSavedLogits(*dir_), Path(nibble::kSavedLogitsFileName));
  EXPECT_EQ(nibble::FindSavedLogits(*dir_ + "/q"), "");
  auto saved = nibble::CompareWithSavedLogits(*dir_, {q_.get()}, text_, opt_);
  ASSERT_TRUE(saved.ok()) << saved.error().message;
  EXPECT_EQ(saved->base_logits_file, Path(nibble::kSavedLogitsFileName));
  EXPECT_DOUBLE_EQ(saved->base.ppl, live->base.ppl);
  EXPECT_DOUBLE_EQ(saved->base.ppl_stderr, live->base.ppl_stderr);
  const auto &a = live->rows[0], &b = saved->rows[0];
  EXPECT_DOUBLE_EQ(a.perplexity.ppl, b.perplexity.ppl);
  EXPECT_DOUBLE_EQ(a.mean_kld, b.mean_kld);
  EXPECT_DOUBLE_EQ(a.mean_kld_error, b.mean_kld_error);
  EXPECT_DOUBLE_EQ(a.kld_p99, b.kld_p99);
  EXPECT_DOUBLE_EQ(a.max_kld, b.max_kld);
  EXPECT_DOUBLE_EQ(a.top1_agreement, b.top1_agreement);
  // Fewer windows than saved are a prefix of the same windows.
  nibble::CompareOptions two = opt_;
  two.max_windows = 2;
  EXPECT_TRUE(nibble::CompareWithSavedLogits(*dir_, {q_.get()}, text_, two).ok());
}

TEST_F(SavedLogitsTest, MismatchedOrDamagedFilesAreErrorsNamingTheFileAndWhatDiffers) {
  nibble::PerplexityOptions po;
  po.seq_len = 128;
  po.max_windows = 3;
  po.threads = 1;
  po.save_logits = Path("base.bin");
  ASSERT_TRUE(nibble::EvaluatePerplexity(*fp_, text_, po).ok());
  const std::string base = Path("base.bin");
  std::string bytes;
  {
    std::ifstream in(base, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  auto write = [&](const std::string& name, const std::string& b) {
    std::ofstream(Path(name), std::ios::binary) << b;
    return Path(name);
  };
  auto expect = [](const std::string& msg, const std::string& a, const std::string& b) {
    EXPECT_NE(msg.find(a), std::string::npos) << msg;
    EXPECT_NE(msg.find(b), std::string::npos) << msg;
  };
  const std::string cut = write("cut.bin", bytes.substr(0, bytes.size() - 100));
  expect(CompareError(cut, opt_, text_), cut, "truncated");
  const std::string header = write("header.bin", bytes.substr(0, 20));
  expect(CompareError(header, opt_, text_), header, "truncated");
  const std::string longer = write("longer.bin", bytes + "x");
  expect(CompareError(longer, opt_, text_), longer, "longer than its header says");
  std::string bad = bytes;
  bad[0] = 'X';
  const std::string magic = write("magic.bin", bad);
  expect(CompareError(magic, opt_, text_), magic, "not a nibble saved-logits file");
  std::string tok = bytes;
  int32_t id;
  std::memcpy(&id, tok.data() + 40 + 4 * 200, 4);
  id = (id + 1) % 512;
  std::memcpy(tok.data() + 40 + 4 * 200, &id, 4);
  const std::string token = write("token.bin", tok);
  expect(CompareError(token, opt_, text_), token, "token 200 (window 1, position 72)");
  nibble::CompareOptions other = opt_;
  other.seq_len = 64;
  expect(CompareError(base, other, text_), base, "saved with --seq_len 128, this run uses --seq_len 64");
  other = opt_;
  other.max_windows = 5;
  expect(CompareError(base, other, text_), base, "holds 3 windows, this run evaluates 5");
  expect(CompareError(base, opt_, text_.substr(500)), base, "a different text or tokenizer");
  auto prose = nibble::Model::Load(nibble_test::EmbeddedModel());
  ASSERT_TRUE(prose.ok());
  expect(CompareError(base, opt_, text_, prose->get()), base, "saved at vocab size 512, the model has vocab size 4096");
  std::filesystem::create_directories(Path("empty"));
  expect(CompareError(Path("empty"), opt_, text_), Path("empty"), "no saved logits");
}

}  // namespace
