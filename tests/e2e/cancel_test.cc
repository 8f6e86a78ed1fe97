// Ctrl-C (SIGINT) and SIGTERM during a long command: the command stops at the library's next
// cancellation check, prints "nibble: cancelled: ... (SIGINT)", exits 128 + the signal (130,
// 143: the shell's convention) and leaves no output (quantize keeps its staging directory for
// --resume); `generate` keeps the text it printed and reports "stop: cancelled". (The handler's
// reset to the default action, which lets a second Ctrl-C kill, is tests/tools/cancel_signal_test.cc.)
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble_test::ReadFile;

using nibble_test::WaitExit;
using nibble_test::WaitForOutput;

// Starts `nibble ARGS` with stdout and stderr to `log` (stdin from `in` when given); returns its pid.
pid_t StartNibble(const std::vector<std::string>& args, const std::string& log, const std::string& in = "") {
  nibble_test::SpawnOptions o;
  o.log = log;
  o.stdin_path = in;
  return nibble_test::SpawnNibble(args, o);
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

// GPTQ of the embedded model on 16 x 128 calibration tokens (the first 60 kB of prose-calib.txt
// in `calib`): about 0.2 s per layer on one thread, so a signal sent when the first of its 6
// layers is logged lands in the middle of the run.
std::vector<std::string> GptqArgs(const std::string& out, const std::string& calib) {
  std::ofstream(calib, std::ios::binary) << ReadFile(nibble_test::SharedData("prose-calib.txt")).substr(0, 60000);
  return {"quantize", "--model_dir", nibble_test::EmbeddedModel(), "--output_dir", out, "--quant_algo", "gptq",
          "--dataset", calib, "--num_calib_data", "16", "--seq_len", "128", "--threads", "1"};
}

// The output is untouched; the layers finished before the signal stay staged for --resume
// (tests/e2e/resume_test.cc).
TEST(CancelCli, CtrlCDuringQuantizeExits130WithNoOutput) {
  NIBBLE_NEEDS_SHARED("data/prose-calib.txt");
  nibble_test::TempDir tmp;
  fs::create_directory(tmp.sub("work"));
  const std::string out = tmp.sub("work/out"), log = tmp.sub("log.txt");
  const pid_t pid = StartNibble(GptqArgs(out, tmp.sub("calib.txt")), log);
  ASSERT_TRUE(WaitForOutput(pid, log, "gptq layers 1/6")) << ReadFile(log);
  kill(pid, SIGINT);
  EXPECT_EQ(WaitExit(pid), 130) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("nibble: cancelled: quantize at "), std::string::npos) << text;
  EXPECT_NE(text.find("nothing was written to " + out + " (SIGINT)"), std::string::npos) << text;
  EXPECT_NE(text.find("run the same command with --resume to continue"), std::string::npos) << text;
  EXPECT_EQ(text.find("gptq layers 6/6"), std::string::npos) << "not stopped before the last layer:\n" << text;
  EXPECT_FALSE(fs::exists(out));
  const std::vector<std::string> left = Listing(tmp.sub("work"));
  ASSERT_EQ(left.size(), 1u) << "the staging directory kept for --resume";
  EXPECT_TRUE(left[0].starts_with(".out.nibble-tmp-")) << left[0];
  EXPECT_TRUE(fs::exists(tmp.sub("work/" + left[0] + "/resume.json")));
}

TEST(CancelCli, SigtermDuringPerplexityExits143) {
  NIBBLE_NEEDS_SHARED("data/prose-val.txt");
  nibble_test::TempDir tmp;
  const std::string log = tmp.sub("log.txt");
  const pid_t pid = StartNibble({"perplexity", "--model", nibble_test::EmbeddedModel(), "--text",
                                 nibble_test::SharedData("prose-val.txt"), "--seq_len", "256", "--threads", "1"},
                                log);
  // Printed once the model is loaded, after the handler is installed.
  ASSERT_TRUE(WaitForOutput(pid, log, "KV cache:")) << ReadFile(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // into the windows
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid), 143) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("nibble: cancelled: "), std::string::npos) << text;
  EXPECT_NE(text.find("(SIGTERM)"), std::string::npos) << text;
  EXPECT_EQ(text.find("perplexity: "), std::string::npos) << "finished instead of stopping:\n" << text;
}

// A dense random-weight model of prose-llama-7m's shapes (its tokenizer) with 8192 positions:
// a generate that fills them takes seconds, so a signal sent once its first text is out lands
// in the middle of it however loaded the machine is.
std::string LongContextModel(const std::string& dir) {
  std::string config = ReadFile(nibble_test::EmbeddedModel() + "/config.json");
  const std::string from = "\"max_position_embeddings\": 512";
  const size_t at = config.find(from);
  if (at == std::string::npos) return "";
  config.replace(at, from.size(), "\"max_position_embeddings\": 8192");
  std::ofstream(dir + "/config.json") << config;
  const auto r = nibble_test::RunNibble("synth --config " + nibble_test::Quote(dir + "/config.json") + " --format dense --out " +
                                        nibble_test::Quote(dir + "/m") + " --tokenizer_dir " +
                                        nibble_test::Quote(nibble_test::EmbeddedModel()));
  return r.exit_code == 0 ? dir + "/m" : "";
}

// The text `generate` printed: from the echoed prompt to the statistics (without the newline
// printed before them).
std::string GeneratedText(const std::string& log, const std::string& prompt) {
  const size_t at = log.find(prompt), end = log.find("\n\nprefill: ");
  return at == std::string::npos || end == std::string::npos || end < at ? "" : log.substr(at, end - at);
}

// `generate` with a long -n: SIGINT once the first generated text is out stops it at the next
// token, the text so far stays printed ("stop: cancelled") and the exit code is 130. The
// reference is the same greedy run with -n 64: the two texts agree as far as both go.
TEST(CancelCli, CtrlCDuringGenerateKeepsTheTextSoFarAndExits130) {
  nibble_test::TempDir tmp;
  const std::string model = LongContextModel(tmp.path());
  ASSERT_FALSE(model.empty());
  const std::string prompt = "Once upon a time";
  std::vector<std::string> args = {"generate", "-m", model, "-p", prompt, "--temperature", "0", "-t", "1", "-n", "64"};
  const std::string ref_log = tmp.sub("ref.txt"), log = tmp.sub("log.txt");
  ASSERT_EQ(WaitExit(StartNibble(args, ref_log)), 0) << ReadFile(ref_log);
  ASSERT_NE(ReadFile(ref_log).find("stop: max_new_tokens"), std::string::npos) << ReadFile(ref_log);
  const std::string ref = GeneratedText(ReadFile(ref_log), prompt);
  ASSERT_GT(ref.size(), prompt.size());

  args.back() = "100000";
  const pid_t pid = StartNibble(args, log);
  bool started = false;  // anything after the echoed prompt
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120); !started && std::chrono::steady_clock::now() < end;) {
    const std::string text = ReadFile(log);
    const size_t at = text.find(prompt);
    started = at != std::string::npos && text.size() > at + prompt.size();
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(started) << ReadFile(log);
  kill(pid, SIGINT);
  EXPECT_EQ(WaitExit(pid), 130) << ReadFile(log);
  const std::string out = ReadFile(log);
  EXPECT_NE(out.find("stop: cancelled"), std::string::npos) << out;
  const std::string text = GeneratedText(out, prompt);
  EXPECT_GT(text.size(), prompt.size()) << out;
  const size_t n = std::min(text.size(), ref.size());
  EXPECT_EQ(text.substr(0, n), ref.substr(0, n)) << "the text printed is not the run's:\n" << out;
}

// SIGINT during the prompt's prefill (8000 tokens: about 2 s on one thread) is a
// "cancelled" error naming where the forward pass stopped, exit 130, nothing generated.
TEST(CancelCli, CtrlCDuringGeneratePrefillIsACancelledError) {
  nibble_test::TempDir tmp;
  const std::string model = LongContextModel(tmp.path());
  ASSERT_FALSE(model.empty());
  std::string prompt;
  for (int i = 0; i < 2000; ++i) prompt += "the dog ran ";
  const std::string log = tmp.sub("log.txt");
  const pid_t pid = StartNibble({"generate", "-m", model, "-p", prompt, "-n", "5", "-t", "1"}, log);
  ASSERT_TRUE(WaitForOutput(pid, log, "seed: ")) << ReadFile(log);  // printed just before the prefill
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(pid, SIGINT);
  EXPECT_EQ(WaitExit(pid), 130) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("nibble: cancelled: forward pass before layer "), std::string::npos) << text;
  EXPECT_NE(text.find("(SIGINT)"), std::string::npos) << text;
  EXPECT_EQ(text.find("prefill: "), std::string::npos) << "generated instead of stopping:\n" << text;
}

// `generate --chat`: SIGINT during a reply ends it and the chat (the reply so far printed, the
// turn's statistics with "stop: cancelled", exit 130); the next user line is never answered.
TEST(CancelCli, CtrlCDuringAChatReplyEndsTheChatWith130) {
  nibble_test::TempDir tmp;
  const std::string model = LongContextModel(tmp.path());
  ASSERT_FALSE(model.empty());
  std::ofstream(tmp.sub("chat.jinja")) << "{% for m in messages %}{{ m.role }}:{{ m.content }}<|end|>\n{% endfor %}"
                                          "{% if add_generation_prompt %}assistant:{% endif %}";
  std::ofstream(tmp.sub("in.txt")) << "Once upon a time there was a dog.\nAnd then?\n";
  const std::string log = tmp.sub("log.txt");
  const pid_t pid = StartNibble({"generate", "-m", model, "--chat", "--chat_template", tmp.sub("chat.jinja"), "-n", "100000",
                                 "--temperature", "0", "-t", "1"},
                                log, tmp.sub("in.txt"));
  ASSERT_TRUE(WaitForOutput(pid, log, "chat template: ")) << ReadFile(log);
  // The first reply text: anything after the line that names the chat template.
  bool started = false;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120); !started && std::chrono::steady_clock::now() < end;) {
    const std::string text = ReadFile(log);
    const size_t eol = text.find('\n', text.find("chat template: "));
    started = eol != std::string::npos && text.size() > eol + 1;
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(started) << ReadFile(log);
  kill(pid, SIGINT);
  EXPECT_EQ(WaitExit(pid), 130) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("chat turn 1: reused 0 cached positions"), std::string::npos) << text;
  EXPECT_NE(text.find("| stop: cancelled"), std::string::npos) << text;
  EXPECT_EQ(text.find("chat turn 2"), std::string::npos) << text;
}

}  // namespace
