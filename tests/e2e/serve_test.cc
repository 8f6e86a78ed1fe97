// `nibble serve` on a loopback port, driven by the official OpenAI client (npm `openai`,
// tests/e2e/serve_client.cjs): chat, streaming against the whole response, stop strings and
// logprobs, echo scoring against `perplexity`, n with a seed, concurrent streams against the same
// requests one at a time, a disconnect (streamed or whole) freeing its slot, OpenAI's penalties,
// keys, a table of bad requests, the load line, and SIGTERM draining. Skips, naming what is
// missing, without node or the package. The KV flags shared with generate, without node.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "test_paths.h"

namespace nibble_test {
namespace {

namespace fs = std::filesystem;

const char* kServeKey = "test-key-123";

std::string ServeNodeModules() { return SourceDir() + "/build/npm/node_modules"; }

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (RunCommand("command -v node >/dev/null 2>&1").exit_code != 0) {
      skip_ = "node not found in PATH";
      return;
    }
    if (!fs::exists(ServeNodeModules() + "/openai")) {
      skip_ = "npm openai not installed in " + ServeNodeModules() + " (scripts/install_node_packages.sh installs it)";
      return;
    }
    skip_ = MissingShared({"models/prose-llama-7m"});
    if (!skip_.empty()) return;
    log_ = (fs::temp_directory_path() / ("nibble_serve_" + std::to_string(getpid()) + ".log")).string();
    const std::string model = SharedModel("prose-llama-7m");
    const std::string tmpl = SourceDir() + "/tests/e2e/data/serve_chat_template.jinja";
    pid_ = SpawnNibble({"serve", "--model", model, "--port", "0", "--api_key", kServeKey, "--alias", "served",
                        "--chat_template", tmpl, "--parallel", "8", "--ctx_size", "512", "--threads", "2"},
                       log_);
    const auto t0 = std::chrono::steady_clock::now();
    std::smatch m;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
      const std::string log = ReadFile(log_);
      if (std::regex_search(log, m, std::regex("ready on port ([0-9]+)"))) {
        base_ = "http://127.0.0.1:" + m[1].str();
        return;
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    start_error_ = "the server did not start: " + ReadFile(log_);
  }

  static void TearDownTestSuite() {
    if (pid_ > 0 && kill(pid_, 0) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!log_.empty()) fs::remove(log_);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(start_error_.empty()) << start_error_;
  }

  // Runs one case of serve_client.cjs; its last output line as JSON.
  static nlohmann::json Client(const std::string& name, const std::string& env = "") {
    const RunResult r = RunCommand(env + " NODE_PATH=" + Quote(ServeNodeModules()) + " node " +
                                   Quote(SourceDir() + "/tests/e2e/serve_client.cjs") + " " + name + " " + Quote(base_) + " " +
                                   kServeKey + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << name << ":\n" << r.out << "\nserver log:\n" << ReadFile(log_);
    const size_t nl = r.out.find_last_of('\n', r.out.size() >= 2 ? r.out.size() - 2 : 0);
    return nlohmann::json::parse(nl == std::string::npos ? r.out : r.out.substr(nl + 1), nullptr, false);
  }

  static inline std::string skip_, start_error_, log_, base_;
  static inline pid_t pid_ = -1;
};

TEST_F(ServeTest, ChatCompletion) { Client("chat"); }
TEST_F(ServeTest, StreamedChatEqualsWholeWithUsage) { Client("stream_equal"); }
TEST_F(ServeTest, StopStringsAcrossTokensAndLogprobs) { Client("stop"); }
TEST_F(ServeTest, NChoicesWithSeed) { Client("n2"); }
TEST_F(ServeTest, EightConcurrentStreamsEqualSequential) { Client("concurrent"); }
TEST_F(ServeTest, DisconnectFreesSlot) { Client("disconnect"); }
TEST_F(ServeTest, DisconnectOfWholeResponseFreesSlot) { Client("disconnect_whole"); }
TEST_F(ServeTest, PresenceAndFrequencyPenalties) { Client("penalties"); }
TEST_F(ServeTest, BoundedLoadLosesNoTokens) { Client("load"); }
TEST_F(ServeTest, ApiKey) { Client("auth"); }
TEST_F(ServeTest, BadRequestsThenHealthy) { Client("bad_requests"); }

// echo + logprobs + max_tokens 0 scores a prompt: its log-probabilities sum to what `perplexity`
// reports for the same window (seq_len tokens from BOS, positions 1.. scored).
TEST_F(ServeTest, EchoLogprobsMatchPerplexity) {
  const std::string text = "Once upon a time there was a little girl who lived in a village near the forest. She liked to walk.";
  const fs::path file = fs::temp_directory_path() / ("nibble_serve_pp_" + std::to_string(getpid()) + ".txt");
  { std::ofstream(file) << text; }
  const int seq_len = 16;
  RunResult r = RunNibble("tokenize --model " + Quote(SharedModel("prose-llama-7m")) + " --file " + Quote(file.string()), false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<int32_t> ids = nlohmann::json::parse(r.out).get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), static_cast<size_t>(seq_len));
  ids.resize(seq_len);
  r = RunNibble("perplexity --model " + Quote(SharedModel("prose-llama-7m")) + " --text " + Quote(file.string()) +
                    " --seq_len " + std::to_string(seq_len) + " --max_windows 1 --json --threads 2",
                false);
  fs::remove(file);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json pp = nlohmann::json::parse(r.out)["perplexity"];
  ASSERT_EQ(pp["scored_tokens"].get<int>(), seq_len - 1);
  const nlohmann::json got = Client("echo", "SERVE_PROMPT_IDS=" + Quote(nlohmann::json(ids).dump()));
  ASSERT_TRUE(got.contains("token_logprobs")) << got.dump();
  double sum = 0;
  for (size_t i = 1; i < got["token_logprobs"].size(); ++i) sum += got["token_logprobs"][i].get<double>();
  EXPECT_NEAR(-sum / (seq_len - 1), pp["mean_nll"].get<double>(), 1e-4);
}

// The load line generate and perplexity print, before ready.
TEST_F(ServeTest, PrintsTheLoadLine) {
  const std::string log = ReadFile(log_);
  const size_t loaded = log.find("loaded in ");
  EXPECT_NE(loaded, std::string::npos) << log;
  EXPECT_LT(loaded, log.find("ready on port")) << log;
}

// Last: SIGTERM lets a running stream finish and the server exit 0. The signal goes once the
// first chunk has arrived, so the stream is running whatever the machine's load; 400 tokens
// (this prompt reaches max_tokens) leave chunks to come after it.
TEST_F(ServeTest, SigtermDrains) {
  const std::string cmd = "curl -sN --max-time 60 -H 'Authorization: Bearer " + std::string(kServeKey) + "' " + base_ +
                          "/v1/completions -d '{\"prompt\": \"The sea\", \"max_tokens\": 400, \"temperature\": 0, "
                          "\"stream\": true}'";
  if (RunCommand("command -v curl >/dev/null 2>&1").exit_code != 0) GTEST_SKIP() << "curl not found";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string streamed;
  std::array<char, 4096> line;
  int after = -1;  // data chunks read after the signal
  while (std::fgets(line.data(), line.size(), p) != nullptr) {
    streamed += line.data();
    if (std::strncmp(line.data(), "data: {", 7) != 0) continue;
    if (after < 0) kill(pid_, SIGTERM);
    ++after;
  }
  const int curl_status = pclose(p);
  ASSERT_GE(after, 0) << "no chunk arrived: " << streamed << "\nserver log:\n" << ReadFile(log_);
  int status = 0;
  ASSERT_EQ(waitpid(pid_, &status, 0), pid_);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(log_);
  EXPECT_EQ(curl_status, 0) << streamed;
  EXPECT_GT(after, 0) << "the stream ended before the signal: nothing was drained";
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed;
  EXPECT_NE(ReadFile(log_).find("draining"), std::string::npos);
}

// The KV flags are generate's: --max_memory bounds the KV caches of all slots (refused after the
// load, with the numbers), a bad --kv_dtype or --max_memory is a usage error naming the flag.
TEST(ServeCli, SharedKvFlags) {
  const std::string model = EmbeddedModel();
  RunResult big = RunNibble("serve --model " + Quote(model) + " --port 0 --parallel 4 --ctx_size 256 --max_memory 1MiB");
  EXPECT_EQ(big.exit_code, 1) << big.out;
  EXPECT_NE(big.out.find("--ctx_size 256 x --parallel 4"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("loaded in "), std::string::npos) << big.out;
  RunResult dtype = RunNibble("serve --model " + Quote(model) + " --kv_dtype fp8");
  EXPECT_EQ(dtype.exit_code, 2) << dtype.out;
  EXPECT_NE(dtype.out.find("--kv_dtype"), std::string::npos) << dtype.out;
  RunResult mem = RunNibble("serve --model " + Quote(model) + " --max_memory 12XB");
  EXPECT_EQ(mem.exit_code, 2) << mem.out;
  EXPECT_NE(mem.out.find("--max_memory"), std::string::npos) << mem.out;
}

}  // namespace
}  // namespace nibble_test
