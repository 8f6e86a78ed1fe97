// Generate's token events and stop reasons (generate.h): logprobs and top logprobs against a
// double-precision log-softmax of the same logits, event texts that concatenate to the text
// stream, every StopReason, stop strings inside Generate, cancellation (before, during and after
// the prefill, from another thread), and PromptLogprobs.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/load_or_fail.h"
#include "api/logprobs.h"
#include "api/model_impl.h"
#include "test_paths.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace {

const nibble::Model& Embedded() {
  static std::unique_ptr<nibble::Model> model = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  return *model;
}

struct Events {
  nibble::GenerateStats stats;
  std::vector<nibble::TokenEvent> events;
  std::string text;  // the event texts concatenated
};

Events RunEvents(nibble::Session& s, const nibble::GenerateOptions& o) {
  Events r;
  auto stats = nibble::Generate(s, o, [&](const nibble::TokenEvent& ev) {
    r.events.push_back(ev);
    r.text += ev.text;
    return true;
  });
  EXPECT_TRUE(stats.ok()) << stats.error().message;
  if (stats.ok()) r.stats = *stats;
  return r;
}

std::unique_ptr<nibble::Session> NewEventSession(const nibble::Model& m, int64_t context = 0) {
  nibble::SessionOptions so;
  so.context = context;
  auto s = nibble::Session::Create(m, so);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? std::move(s).value() : nullptr;
}

bool ValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// The reference: log-softmax in double, and the top n ids by logit (ties: lower id first).
std::vector<double> LogSoftmax(const float* logits, size_t vocab) {
  double max = logits[0];
  for (size_t i = 0; i < vocab; ++i) max = std::max(max, static_cast<double>(logits[i]));
  double sum = 0;
  for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  std::vector<double> out(vocab);
  for (size_t i = 0; i < vocab; ++i) out[i] = static_cast<double>(logits[i]) - max - std::log(sum);
  return out;
}

void ExpectLogprobs(const nibble::TokenEvent& ev, const std::vector<double>& ref, int top_n, const std::string& where) {
  EXPECT_NEAR(ev.logprob, ref[static_cast<size_t>(ev.id)], 1e-5) << where;
  std::vector<int32_t> ids(ref.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  ASSERT_EQ(ev.top_logprobs.size(), static_cast<size_t>(top_n)) << where;
  for (int k = 0; k < top_n; ++k) {
    EXPECT_EQ(ev.top_logprobs[k].id, ids[k]) << where << " rank " << k;
    EXPECT_NEAR(ev.top_logprobs[k].logprob, ref[static_cast<size_t>(ids[k])], 1e-5) << where << " rank " << k;
  }
}

// A greedy run's events replayed on a second session step by step: each event's logprob and top
// logprobs are those of the logits it was sampled from, the raw distribution (a repeat penalty,
// which changes the choice, does not change them).
TEST(TokenEvents, LogprobsAreTheLogSoftmaxOfTheLogits) {
  const nibble::Model& m = Embedded();
  for (float penalty : {1.0f, 1.5f}) {
    auto s = NewEventSession(m), replay = NewEventSession(m);
    ASSERT_TRUE(s && replay);
    auto o = nibble_test::GreedyOptions("And God said unto Moses", 16);
    o.logprobs = true;
    o.top_logprobs = 5;
    o.sampling.repeat_penalty = penalty;
    const Events r = RunEvents(*s, o);
    ASSERT_EQ(r.events.size(), 16u);
    auto prompt = m.Tokenize(o.prompt);
    ASSERT_TRUE(prompt.ok());
    ASSERT_TRUE(replay->Prefill(*prompt).ok());
    for (size_t i = 0; i < r.events.size(); ++i) {
      const nibble::TokenEvent& ev = r.events[i];
      const std::vector<double> ref = LogSoftmax(replay->logits().data(), replay->logits().size());
      ExpectLogprobs(ev, ref, 5, "penalty " + std::to_string(penalty) + " token " + std::to_string(i));
      if (penalty == 1.0f) {
        EXPECT_EQ(ev.id, ev.top_logprobs[0].id) << "greedy takes the most likely token";
      }
      ASSERT_TRUE(replay->Step(ev.id).ok());
    }
  }
}

// The events' texts are the text stream: whole UTF-8 characters each, together the decoded ids.
// FillLogprobs alone on vocabulary sizes that end inside its lanes and chunks, and on rows whose
// logits span from far below the largest to ties at it: each id's logprob is the double
// log-softmax within 1e-5.
TEST(TokenEvents, FillLogprobsEqualsTheDoubleLogSoftmax) {
  const nibble::StreamDecoder stream(nibble::ModelAccess::tokenizer(Embedded()));
  std::mt19937 gen(7);
  for (const int64_t vocab : {1, 7, 9, 511, 513, 1030, 32003}) {
    for (const float spread : {0.5f, 8.0f, 20.0f}) {  // logprobs above -200: float rounds them within 1e-5
      std::normal_distribution<float> dist(-2.0f, spread);
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (float& l : logits) l = dist(gen);
      logits[static_cast<size_t>(vocab / 2)] = logits[static_cast<size_t>(vocab - 1)] = 40.0f;  // a tie at the top
      const std::vector<double> ref = LogSoftmax(logits.data(), logits.size());
      for (const int32_t id : {int32_t{0}, static_cast<int32_t>(vocab / 3), static_cast<int32_t>(vocab - 1)}) {
        nibble::TokenEvent ev;
        ev.id = id;
        const int top_n = static_cast<int>(std::min<int64_t>(3, vocab));
        nibble::FillLogprobs(logits.data(), vocab, top_n, stream, ev);
        ExpectLogprobs(ev, ref, top_n,
                       "vocab " + std::to_string(vocab) + " spread " + std::to_string(spread) + " id " + std::to_string(id));
      }
    }
  }
}

TEST(TokenEvents, TextsConcatenateToTheTextStream) {
  const nibble::Model& m = Embedded();
  for (const std::string& prompt : {std::string("And God said"), std::string("Le café était déjà là, naïf —")}) {
    auto o = nibble_test::GreedyOptions(prompt, 24);
    o.sampling.temperature = 1.5f;  // wander into rarer pieces
    o.sampling.seed = 3;
    auto a = NewEventSession(m), b = NewEventSession(m);
    ASSERT_TRUE(a && b);
    const Events r = RunEvents(*a, o);
    std::string streamed;
    ASSERT_TRUE(nibble::Generate(*b, o, [&](std::string_view piece) {
                  streamed += piece;
                  return true;
                }).ok());
    EXPECT_EQ(r.text, streamed);
    std::vector<int32_t> ids = *m.Tokenize(prompt);
    const std::string before = m.Detokenize(ids);
    for (const nibble::TokenEvent& ev : r.events) {
      EXPECT_TRUE(ValidUtf8(ev.text)) << ev.text;
      if (ev.id != nibble::TokenEvent::kNoToken) ids.push_back(ev.id);
      EXPECT_EQ(ev.logprob, 0.0f) << "not computed unless asked for";
      EXPECT_TRUE(ev.top_logprobs.empty());
    }
    EXPECT_EQ(before + r.text, m.Detokenize(ids));
  }
}

// A stop string spanning two tokens: the text up to it is shown, it and the rest never are (the
// first half is held back in its token's event), and stats name it.
TEST(TokenEvents, StopStringSpanningTwoTokens) {
  const nibble::Model& m = Embedded();
  auto ref_session = NewEventSession(m);
  ASSERT_TRUE(ref_session);
  const Events full = RunEvents(*ref_session, nibble_test::GreedyOptions("And God said", 32));
  // Two neighbouring events with two or more bytes of text each, whose joint 4 bytes first occur there.
  size_t offset = 0, k = 0;
  std::string stop;
  for (size_t i = 0; i + 1 < full.events.size() && stop.empty(); offset += full.events[i].text.size(), ++i) {
    const std::string& a = full.events[i].text;
    const std::string& b = full.events[i + 1].text;
    if (a.size() < 2 || b.size() < 2) continue;
    const std::string s = a.substr(a.size() - 2) + b.substr(0, 2);
    if (full.text.find(s) == offset + a.size() - 2 && ValidUtf8(s)) stop = s, k = i;
  }
  ASSERT_FALSE(stop.empty()) << full.text;
  auto s = NewEventSession(m);
  auto o = nibble_test::GreedyOptions("And God said", 32);
  o.stop = {"never in this text", stop};
  const Events r = RunEvents(*s, o);
  EXPECT_EQ(r.stats.stop_reason, nibble::StopReason::kStopString);
  EXPECT_STREQ(nibble::StopReasonName(r.stats.stop_reason), "stop_string");
  EXPECT_STREQ(nibble::FinishReason(r.stats.stop_reason), "stop");
  EXPECT_EQ(r.stats.stop_string, stop);
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  ASSERT_EQ(r.events.size(), k + 2) << "the token that completes the stop string is the last";
  EXPECT_EQ(r.stats.generated_tokens, static_cast<int64_t>(k + 2));
  const std::string& first = full.events[k].text;
  EXPECT_EQ(r.events[k].text, first.substr(0, first.size() - 2)) << "the stop string's start is held back";
  EXPECT_EQ(r.events[k + 1].text, "");
}

// A tiny model whose every layer adds nothing and whose lm_head row j is the embedding of j + 1:
// from token x it predicts x - 1, so from 5 it streams 4, 3 and then stops at EOS (id 2).
TEST(TokenEvents, EosEndsGeneration) {
  nibble_test::TempDir tmp;
  nibble_test::TinyLlamaSpec spec;
  spec.dtype = nibble::DType::kF32;
  std::vector<float> embed;
  nibble_test::WriteTinyModel(tmp.path(), spec, [&](const std::string& name, std::vector<float>& v) {
    if (name == "model.embed_tokens.weight") embed = v;
    if (name.find("_proj.") != std::string::npos) std::fill(v.begin(), v.end(), 0.0f);
    if (name == "lm_head.weight")
      for (int64_t j = 0; j + 1 < spec.vocab; ++j)
        std::copy_n(embed.begin() + (j + 1) * spec.hidden, spec.hidden, v.begin() + j * spec.hidden);
  });
  auto m = nibble_test::LoadOrFail(tmp.path());
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->special_tokens().eos_ids, std::vector<int32_t>{2});
  auto s = NewEventSession(*m);
  ASSERT_TRUE(s && s->Prefill({1, 5}).ok());
  const Events r = RunEvents(*s, nibble_test::GreedyOptions("", 10));
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].id, 4);
  EXPECT_EQ(r.events[1].id, 3);
  EXPECT_EQ(r.stats.stop_reason, nibble::StopReason::kEos);
  EXPECT_EQ(r.stats.stop_token, 2);
  EXPECT_EQ(r.stats.generated_tokens, 2);
  EXPECT_EQ(s->position(), 4) << "an EOS stop leaves nothing unfed";
}

// The other stop reasons: length, a stop id, a full context, the callback, a cancel after tokens.
TEST(TokenEvents, EveryOtherStopReason) {
  const nibble::Model& m = Embedded();
  auto s = NewEventSession(m);
  ASSERT_TRUE(s);
  const Events len = RunEvents(*s, nibble_test::GreedyOptions("And God said", 4));
  EXPECT_EQ(len.stats.stop_reason, nibble::StopReason::kLength);
  EXPECT_STREQ(nibble::FinishReason(len.stats.stop_reason), "length");
  EXPECT_EQ(len.events.size(), 4u);

  s = NewEventSession(m);
  auto o = nibble_test::GreedyOptions("And God said", 8);
  o.stop_ids = {len.events[2].id};
  const size_t first = static_cast<size_t>(
      std::find_if(len.events.begin(), len.events.end(), [&](const auto& e) { return e.id == o.stop_ids[0]; }) - len.events.begin());
  const Events stop_id = RunEvents(*s, o);
  EXPECT_EQ(stop_id.stats.stop_reason, nibble::StopReason::kStopToken);
  EXPECT_EQ(stop_id.stats.stop_token, o.stop_ids[0]);
  EXPECT_EQ(stop_id.stats.generated_tokens, static_cast<int64_t>(first));

  auto small = NewEventSession(m, 8);
  ASSERT_TRUE(small);
  const Events full = RunEvents(*small, nibble_test::GreedyOptions("And God said", 100));
  EXPECT_EQ(full.stats.stop_reason, nibble::StopReason::kContextFull);
  EXPECT_STREQ(nibble::StopReasonName(full.stats.stop_reason), "context_full");
  EXPECT_EQ(small->position(), 8);

  s = NewEventSession(m);
  int calls = 0;
  auto cb = nibble::Generate(*s, nibble_test::GreedyOptions("And God said", 20), [&](const nibble::TokenEvent&) { return ++calls < 3; });
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(cb->stop_reason, nibble::StopReason::kCallback);
  EXPECT_EQ(cb->generated_tokens, 3);

  // A cancel after tokens were streamed ends generation with them; the session goes on from there.
  s = NewEventSession(m);
  auto ref = NewEventSession(m);
  ASSERT_TRUE(ref);
  const Events whole = RunEvents(*ref, nibble_test::GreedyOptions("And God said", 6));
  nibble::CancellationToken cancel;
  o = nibble_test::GreedyOptions("And God said", 6);
  o.cancel = &cancel;
  std::vector<int32_t> ids;
  auto c = nibble::Generate(*s, o, [&](const nibble::TokenEvent& ev) {
    ids.push_back(ev.id);
    if (ids.size() == 3) cancel.Cancel();
    return true;
  });
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->stop_reason, nibble::StopReason::kCancelled);
  EXPECT_STREQ(nibble::FinishReason(c->stop_reason), "abort");
  EXPECT_EQ(c->generated_tokens, 3);
  ASSERT_EQ(ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ids[i], whole.events[i].id);
  // Both sessions continue with the same text from the same context.
  const int64_t pos = s->position();
  auto more = nibble::Generate(*s, nibble_test::GreedyOptions(" and", 4), [](std::string_view) { return true; });
  ASSERT_TRUE(more.ok()) << more.error().message;
  EXPECT_GT(s->position(), pos);
}

// Cancelled before the first token: an error with kCancelled, and the session as it was.
TEST(TokenEvents, CancelBeforeTheFirstTokenIsAnErrorAndChangesNothing) {
  const nibble::Model& m = Embedded();
  auto s = NewEventSession(m), ref = NewEventSession(m);
  ASSERT_TRUE(s && ref);
  RunEvents(*s, nibble_test::GreedyOptions("And God said", 3));
  RunEvents(*ref, nibble_test::GreedyOptions("And God said", 3));
  const int64_t pos = s->position();
  const std::vector<float> logits = s->logits();
  nibble::CancellationToken cancel;
  cancel.Cancel();
  auto o = nibble_test::GreedyOptions(" unto Moses", 5);
  o.cancel = &cancel;
  int calls = 0;
  auto r = nibble::Generate(*s, o, [&](const nibble::TokenEvent&) { return ++calls > 0; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, nibble::ErrorCode::kCancelled) << r.error().message;
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(s->position(), pos);
  EXPECT_EQ(s->logits(), logits);
  const Events a = RunEvents(*s, nibble_test::GreedyOptions(" unto Moses", 5)), b = RunEvents(*ref, nibble_test::GreedyOptions(" unto Moses", 5));
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.stats.prompt_tokens, b.stats.prompt_tokens);
}

// Session::Prefill and Step with a cancelled token: kCancelled, and position, tokens and logits
// as before (the repeat penalty's history too: the next greedy choice with a penalty is unchanged).
TEST(TokenEvents, CancelledPrefillAndStepChangeNothing) {
  const nibble::Model& m = Embedded();
  auto s = NewEventSession(m);
  ASSERT_TRUE(s && s->Prefill({1, 365, 581, 558}).ok());
  const std::vector<float> logits = s->logits();
  nibble::CancellationToken cancel;
  cancel.Cancel();
  const nibble::Status p = s->Prefill({437, 1392}, &cancel), t = s->Step(437, &cancel);
  ASSERT_FALSE(p.ok());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(p.error().code, nibble::ErrorCode::kCancelled) << p.error().message;
  EXPECT_EQ(t.error().code, nibble::ErrorCode::kCancelled) << t.error().message;
  EXPECT_EQ(s->position(), 4);
  EXPECT_EQ(s->logits(), logits);
  ASSERT_TRUE(s->Step(437, nullptr).ok());
  auto fresh = NewEventSession(m);
  ASSERT_TRUE(fresh && fresh->Prefill({1, 365, 581, 558, 437}).ok());
  EXPECT_EQ(s->position(), fresh->position());
  nibble::SamplingOptions o;
  o.temperature = 0;
  o.repeat_penalty = 1.5f;
  EXPECT_EQ(*s->Sample(o), *fresh->Sample(o));
}

// A cancel from another thread that lands inside the prefill (after its first layer): kCancelled,
// the session at its old position, and a later Generate as on a session never cancelled.
TEST(TokenEvents, CancelFromAnotherThreadMidPrefill) {
  const nibble::Model& m = Embedded();
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "And the king said unto the people. ";
  auto untouched = NewEventSession(m);
  ASSERT_TRUE(untouched);
  RunEvents(*untouched, nibble_test::GreedyOptions("And God said", 3));
  const int64_t old = untouched->position();
  ASSERT_LT(old + *untouched->PromptPositions(long_prompt) + 4, untouched->capacity());
  // The prefill's length, to aim the cancel into it.
  auto timing = NewEventSession(m);
  ASSERT_TRUE(timing);
  RunEvents(*timing, nibble_test::GreedyOptions("And God said", 3));
  const double prefill = RunEvents(*timing, nibble_test::GreedyOptions(long_prompt, 1)).stats.prefill_seconds;
  bool landed = false;
  for (int attempt = 0; attempt < 60 && !landed; ++attempt) {
    auto s = NewEventSession(m);
    ASSERT_TRUE(s);
    RunEvents(*s, nibble_test::GreedyOptions("And God said", 3));
    nibble::CancellationToken cancel;
    auto o = nibble_test::GreedyOptions(long_prompt, 4);
    o.cancel = &cancel;
    const double frac = 0.1 + 0.8 * ((attempt * 7) % 10) / 10.0;
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::duration<double>(prefill * frac));
      cancel.Cancel();
    });
    auto r = nibble::Generate(*s, o, [](const nibble::TokenEvent&) { return true; });
    t.join();
    if (r.ok()) continue;  // landed after the first token
    ASSERT_EQ(r.error().code, nibble::ErrorCode::kCancelled) << r.error().message;
    EXPECT_EQ(s->position(), old) << r.error().message;
    const std::string& msg = r.error().message;
    if (msg.find("before layer ") == std::string::npos || msg.find("before layer 0") != std::string::npos) continue;
    landed = true;
    const Events a = RunEvents(*s, nibble_test::GreedyOptions(" and", 8)), b = RunEvents(*untouched, nibble_test::GreedyOptions(" and", 8));
    ASSERT_EQ(a.events.size(), b.events.size());
    for (size_t i = 0; i < a.events.size(); ++i) EXPECT_EQ(a.events[i].id, b.events[i].id) << "token " << i;
    EXPECT_EQ(s->position(), untouched->position());
  }
  EXPECT_TRUE(landed) << "no cancel landed inside the prefill in 60 attempts (prefill " << prefill << " s)";
}

TEST(PromptLogprobs, AreTheLogSoftmaxOfEachPrecedingPosition) {
  const nibble::Model& m = Embedded();
  const std::string text = "And God said unto Moses: le café — naïf";
  auto ids = m.Tokenize(text);
  ASSERT_TRUE(ids.ok());
  auto events = nibble::PromptLogprobs(m, *ids, 4);
  ASSERT_TRUE(events.ok()) << events.error().message;
  ASSERT_EQ(events->size(), ids->size());
  auto logits = m.Logits(*ids);
  ASSERT_TRUE(logits.ok());
  const size_t vocab = logits->size() / ids->size();
  EXPECT_TRUE(std::isnan((*events)[0].logprob));
  EXPECT_TRUE((*events)[0].top_logprobs.empty());
  std::string joined;
  for (size_t i = 0; i < ids->size(); ++i) {
    const nibble::TokenEvent& ev = (*events)[i];
    EXPECT_EQ(ev.id, (*ids)[i]);
    EXPECT_TRUE(ValidUtf8(ev.text)) << ev.text;
    joined += ev.text;
    if (i > 0) ExpectLogprobs(ev, LogSoftmax(logits->data() + (i - 1) * vocab, vocab), 4, "position " + std::to_string(i));
  }
  EXPECT_EQ(joined, m.Detokenize(*ids));
  EXPECT_EQ(joined, text);
}

// Model::Logits and PromptLogprobs with a cancelled token: kCancelled (checked before each layer).
TEST(PromptLogprobs, AndLogitsStopWhenCancelled) {
  const nibble::Model& m = Embedded();
  nibble::CancellationToken cancel;
  cancel.Cancel();
  auto l = m.Logits({1, 50, 60}, &cancel);
  auto p = nibble::PromptLogprobs(m, {1, 50, 60}, 0, &cancel);
  ASSERT_FALSE(l.ok());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(l.error().code, nibble::ErrorCode::kCancelled) << l.error().message;
  EXPECT_EQ(p.error().code, nibble::ErrorCode::kCancelled) << p.error().message;
  nibble::CancellationToken idle;
  EXPECT_EQ(*m.Logits({1, 50, 60}, &idle), *m.Logits({1, 50, 60}));
}

TEST(PromptLogprobs, RefusesBadArguments) {
  const nibble::Model& m = Embedded();
  auto many = nibble::PromptLogprobs(m, {1, 50}, 21);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.error().message.find("top_logprobs 21"), std::string::npos) << many.error().message;
  EXPECT_FALSE(nibble::PromptLogprobs(m, {}, 0).ok());
  EXPECT_FALSE(nibble::PromptLogprobs(m, {1, static_cast<int32_t>(m.info().vocab_size)}, 0).ok());
}

TEST(TokenEvents, OptionsAreValidatedWithTheFieldNamed) {
  auto check = [](const nibble::GenerateOptions& o, const std::string& want) {
    const nibble::Status s = nibble::ValidateGenerateOptions(o, "--");
    ASSERT_FALSE(s.ok()) << want;
    EXPECT_EQ(s.error().message.rfind(want, 0), 0u) << s.error().message;
  };
  nibble::GenerateOptions o;
  o.logprobs = true;
  o.top_logprobs = 20;
  EXPECT_TRUE(nibble::ValidateGenerateOptions(o).ok());
  o.top_logprobs = 21;
  check(o, "--top_logprobs 21 must be in [0, 20]");
  o.top_logprobs = -1;
  check(o, "--top_logprobs -1");
  o.top_logprobs = 2;
  o.logprobs = false;
  check(o, "--top_logprobs 2 needs --logprobs");
  o = nibble::GenerateOptions();
  o.stop = {"a", ""};
  check(o, "--stop: empty stop string (entry 1)");
}

// GenerateOptions::prompt_ids: the ids of a text run as they are give what the text gives (the
// reference: Generate from the text, which the tokenizer turns into the same ids), on an empty
// session and after an earlier call; no BOS is added; cached_tokens is the position found.
TEST(PromptIds, GenerateFromIdsEqualsGenerateFromTheText) {
  const nibble::Model& m = Embedded();
  const std::string first = "Once upon a time there was a dog", second = " who liked to run in the park.";
  auto ids1 = m.Tokenize(first);
  ASSERT_TRUE(ids1.ok());
  ASSERT_EQ(ids1->front(), m.special_tokens().bos_id);
  auto text_s = NewEventSession(m), ids_s = NewEventSession(m);
  nibble::GenerateOptions by_ids = nibble_test::GreedyOptions("", 6);
  by_ids.prompt_ids = *ids1;
  const Events a = RunEvents(*text_s, nibble_test::GreedyOptions(first, 6)), b = RunEvents(*ids_s, by_ids);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) EXPECT_EQ(a.events[i].id, b.events[i].id) << "token " << i;
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(b.stats.prompt_tokens, static_cast<int64_t>(ids1->size()));
  EXPECT_EQ(a.stats.prompt_tokens, b.stats.prompt_tokens);
  EXPECT_EQ(b.stats.cached_tokens, 0);
  EXPECT_EQ(text_s->tokens(), ids_s->tokens());

  // A second turn on each: the token left to run and the new ids, cached_tokens the held positions.
  const int64_t held = ids_s->position();
  const Events c = RunEvents(*text_s, nibble_test::GreedyOptions(second, 6));
  // The ids the second text tokenized to, after the token the first call left to run.
  const auto from = held + (a.stats.stop_reason == nibble::StopReason::kLength ? 1 : 0);
  ASSERT_GE(static_cast<int64_t>(text_s->tokens().size()), from + c.stats.prompt_tokens);
  const std::vector<int32_t> ids2(text_s->tokens().begin() + from, text_s->tokens().begin() + from + c.stats.prompt_tokens);
  by_ids.prompt_ids = ids2;
  const Events d = RunEvents(*ids_s, by_ids);
  EXPECT_EQ(c.text, d.text);
  EXPECT_EQ(d.stats.cached_tokens, held);
  EXPECT_EQ(c.stats.cached_tokens, d.stats.cached_tokens);
  EXPECT_EQ(d.stats.prompt_tokens, static_cast<int64_t>(ids2.size()));
  EXPECT_EQ(text_s->tokens(), ids_s->tokens());

  // Exactly the ids given: no BOS on an empty session unless the caller put it first.
  auto bare = NewEventSession(m);
  by_ids.prompt_ids = ids2;
  const Events e = RunEvents(*bare, by_ids);
  EXPECT_EQ(e.stats.prompt_tokens, static_cast<int64_t>(ids2.size()));
  EXPECT_EQ(std::vector<int32_t>(bare->tokens().begin(), bare->tokens().begin() + static_cast<std::ptrdiff_t>(ids2.size())), ids2);

  // Generate over the model sizes its session from the ids.
  by_ids.prompt_ids = *ids1;
  std::string text;
  auto f = nibble::Generate(m, by_ids, [&](std::string_view piece) {
    text += piece;
    return true;
  });
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(text, a.text);
}

TEST(PromptIds, BadIdsAndBothPromptsAreNamedErrorsThatChangeNothing) {
  const nibble::Model& m = Embedded();
  const auto vocab = static_cast<int32_t>(m.info().vocab_size);
  auto s = NewEventSession(m);
  nibble::GenerateOptions o = nibble_test::GreedyOptions("Once", 2);
  o.prompt_ids = {1, 5};
  auto r = nibble::Generate(*s, o, [](std::string_view) { return true; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("prompt and prompt_ids are both given (2 ids): give one"), std::string::npos) << r.error().message;
  const nibble::Status v = nibble::ValidateGenerateOptions(o, "--");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("--prompt and --prompt_ids"), std::string::npos) << v.error().message;
  o.prompt.clear();
  for (const int32_t bad : {vocab, -1}) {
    o.prompt_ids = {1, 5, bad};
    r = nibble::Generate(*s, o, [](std::string_view) { return true; });
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, "prompt_ids[2] = " + std::to_string(bad) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab) + ")");
    EXPECT_EQ(s->position(), 0);
  }
  r = nibble::Generate(m, o, [](std::string_view) { return true; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("prompt_ids[2] = -1 is outside the vocabulary"), std::string::npos) << r.error().message;
}

}  // namespace
