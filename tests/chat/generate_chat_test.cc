// `nibble generate --chat` on the embedded SentencePiece model (no chat_template of its own)
// with a template from a file: two turns from stdin, the KV cache kept between them.
#include <algorithm>
#include <fstream>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

constexpr const char* kChatTestTemplate =
    "{%- for m in messages %}\n"
    "{%- if m.role == 'system' %}{{ m.content }}\n"
    "{% else %}{{ m.role | capitalize }}:{{ m.content }}<|end|>\n"
    "{% endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ speaker }}:{% endif %}\n";

struct ChatTurnStats {
  long long reused = -1, prefill = -1, decoded = -1;
  std::string stop;
};

std::vector<ChatTurnStats> ParseChatTurns(const std::string& out) {
  std::vector<ChatTurnStats> turns;
  const std::regex re(R"(chat turn \d+: reused (\d+) cached positions \| prefill: (\d+) tokens .*\| decode: (\d+) tokens .*\| stop: ([a-z_]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    turns.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[3]), (*it)[4]});
  return turns;
}

// Token ids as `nibble tokenize` gives them (with BOS), a JSON array.
size_t TokenCount(const std::string& text_file) {
  const auto r = nibble_test::RunNibble("tokenize -m " + nibble_test::Quote(nibble_test::EmbeddedModel()) + " -f " +
                                        nibble_test::Quote(text_file));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out.empty() ? 0 : static_cast<size_t>(std::count(r.out.begin(), r.out.end(), ',')) + 1;
}

TEST(GenerateChat, TwoTurnsReuseTheKvCache) {
  nibble_test::TempDir dir("nibble_chat_cli_");
  const std::string tmpl = dir.path() + "/chat.jinja", err = dir.path() + "/stderr.txt";
  std::ofstream(tmpl) << kChatTestTemplate;
  const std::string system = "You tell short stories about animals living on a farm near the river.";
  const std::string user1 = "Once upon a time there was a dog.", user2 = "What did the dog do next?";
  const auto r = nibble_test::RunCommand(
      "printf '" + user1 + "\\n" + user2 + "\\n' | " + nibble_test::Quote(nibble_test::NibbleBinary()) + " generate -m " +
      nibble_test::Quote(nibble_test::EmbeddedModel()) + " --chat --chat_template " + nibble_test::Quote(tmpl) +
      " --system '" + system + "' -n 8 --temperature 0 -t 2" +
      " --chat_template_kwargs '{\"speaker\": \"Assistant\"}' 2>" + nibble_test::Quote(err));
  const std::string log = nibble_test::ReadFile(err);
  ASSERT_EQ(r.exit_code, 0) << r.out << log;
  const std::vector<ChatTurnStats> turns = ParseChatTurns(log);
  ASSERT_EQ(turns.size(), 2u) << log;
  EXPECT_EQ(turns[0].reused, 0);
  // The replies, one a line on stdout; the whole render of each turn written out by hand
  // (trim_blocks, as Transformers renders) and tokenized by `nibble tokenize`.
  const size_t eol = r.out.find('\n');
  ASSERT_NE(eol, std::string::npos) << r.out;
  const std::string reply1 = r.out.substr(0, eol);
  const std::string render1 = system + "\nUser:" + user1 + "<|end|>\nAssistant:";
  const std::string render2 = render1 + reply1 + "<|end|>\nUser:" + user2 + "<|end|>\nAssistant:";
  std::ofstream(dir.path() + "/r1.txt", std::ios::binary) << render1;
  std::ofstream(dir.path() + "/r2.txt", std::ios::binary) << render2;
  const auto n1 = static_cast<long long>(TokenCount(dir.path() + "/r1.txt"));
  const auto n2 = static_cast<long long>(TokenCount(dir.path() + "/r2.txt"));
  EXPECT_EQ(turns[0].prefill, n1) << log;
  // Turn 2 keeps the common token prefix of what turn 1 left in the cache (its prompt and the
  // reply's tokens but the last, which a reply cut by -n leaves unrun) and prefills the rest
  // of the whole render: at least turn 1's prompt is kept, at most what the cache held.
  const long long held1 = turns[0].prefill + turns[0].decoded + 1 - (turns[0].stop == "eos" || turns[0].stop == "stop_token" ? 0 : 1);
  EXPECT_EQ(turns[1].reused + turns[1].prefill, n2) << log;
  EXPECT_GE(turns[1].reused, n1) << log;
  EXPECT_LE(turns[1].reused, held1) << log;
  EXPECT_LT(turns[1].prefill, turns[0].prefill) << log;
}

// A conversation that outgrows --ctx_size ends at a turn boundary with a message, exit 0.
TEST(GenerateChat, AFullContextEndsTheChatAtATurnBoundary) {
  nibble_test::TempDir dir("nibble_chat_cli_");
  const std::string tmpl = dir.path() + "/chat.jinja";
  std::ofstream(tmpl) << kChatTestTemplate;
  const auto r = nibble_test::RunCommand(
      "printf 'Once upon a time there was a dog.\\nWhat did the dog do next?\\nAnd then?\\nTell me more.\\n' | " +
      nibble_test::Quote(nibble_test::NibbleBinary()) + " generate -m " + nibble_test::Quote(nibble_test::EmbeddedModel()) +
      " --chat --chat_template " + nibble_test::Quote(tmpl) + " --chat_template_kwargs '{\"speaker\": \"Assistant\"}'" +
      " -n 8 --temperature 0 -t 2 --ctx_size 64 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<ChatTurnStats> turns = ParseChatTurns(r.out);
  EXPECT_GE(turns.size(), 1u) << r.out;
  EXPECT_LT(turns.size(), 4u) << r.out;
  EXPECT_NE(r.out.find("no longer fits the context of 64 positions (--ctx_size); ending the chat"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("error"), std::string::npos) << r.out;
}

TEST(GenerateChat, ErrorsNameTheTemplateProblem) {
  nibble_test::TempDir dir("nibble_chat_cli_err_");
  const std::string bad = dir.path() + "/bad.jinja";
  std::ofstream(bad) << "{% for m in messages %}\n{{ m.content | frobnicate }}{% endfor %}";
  auto r = nibble_test::RunCommand("echo hi | " + nibble_test::Quote(nibble_test::NibbleBinary()) + " generate -m " +
                                   nibble_test::Quote(nibble_test::EmbeddedModel()) + " --chat --chat_template " +
                                   nibble_test::Quote(bad) + " -n 2 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find(bad + ":2:16: unknown filter 'frobnicate'"), std::string::npos) << r.out;
  // The embedded model's tokenizer_config.json has no chat_template: the error says what to pass.
  r = nibble_test::RunCommand("echo hi | " + nibble_test::Quote(nibble_test::NibbleBinary()) + " generate -m " +
                              nibble_test::Quote(nibble_test::EmbeddedModel()) + " --chat -n 2 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("no \"chat_template\" (give one with --chat_template FILE)"), std::string::npos) << r.out;
  r = nibble_test::RunNibble("generate -m " + nibble_test::Quote(nibble_test::EmbeddedModel()) + " -p hi --system x -n 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--system, --chat_template and --chat_template_kwargs need --chat"), std::string::npos) << r.out;
  const std::string good = dir.path() + "/good.jinja";
  std::ofstream(good) << kChatTestTemplate;
  r = nibble_test::RunCommand("echo hi | " + nibble_test::Quote(nibble_test::NibbleBinary()) + " generate -m " +
                              nibble_test::Quote(nibble_test::EmbeddedModel()) + " --chat --chat_template " +
                              nibble_test::Quote(good) + " --chat_template_kwargs '[1]' -n 2 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("nibble: error: --chat_template_kwargs: extra chat template variables: expected a JSON object"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("found: [1]"), std::string::npos) << r.out;
}

// On a terminal each user turn is asked for with "> " (as llama-cli does); piped, stdout holds
// the replies alone. script(1) gives the command a pseudo-terminal.
TEST(GenerateChat, PromptMarkerOnATerminalOnly) {
  nibble_test::TempDir dir("nibble_chat_cli_tty_");
  const std::string tmpl = dir.path() + "/chat.jinja";
  std::ofstream(tmpl) << kChatTestTemplate;
  const std::string cmd = nibble_test::Quote(nibble_test::NibbleBinary()) + " generate -m " +
                          nibble_test::Quote(nibble_test::EmbeddedModel()) + " --chat --chat_template " +
                          nibble_test::Quote(tmpl) + " -n 3 --temperature 0";
  auto count = [](const std::string& s) {  // lines that start with the marker
    size_t n = s.starts_with("> ") ? 1 : 0;
    for (size_t p = s.find("\n> "); p != std::string::npos; p = s.find("\n> ", p + 1)) ++n;
    return n;
  };
  const auto piped = nibble_test::RunCommand("printf 'hi\\nthere\\n' | " + cmd + " 2>/dev/null");
  ASSERT_EQ(piped.exit_code, 0) << piped.out;
  EXPECT_EQ(count(piped.out), 0u) << piped.out;
  if (nibble_test::RunCommand("command -v script >/dev/null").exit_code != 0) GTEST_SKIP() << "needs script(1) (util-linux)";
  const auto tty = nibble_test::RunCommand("printf 'hi\\nthere\\n' | timeout 60 script -qec " +
                                           nibble_test::Quote(cmd + " 2>/dev/null") + " /dev/null");
  ASSERT_EQ(tty.exit_code, 0) << tty.out;
  EXPECT_EQ(count(tty.out), 3u) << tty.out;  // before each of the two turns, and before EOF
}

}  // namespace
