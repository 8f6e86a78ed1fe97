// OpenAI request parsing of `nibble serve` (src/serve/request.h): shapes, defaults, and a 400
// naming the field for every wrong type or value.
#include <gtest/gtest.h>

#include "serve/request.h"
#include "serve/server_impl.h"

namespace nibble::serve {
namespace {

using json = nlohmann::json;

std::optional<CompletionRequest> Parse(const std::string& body, Endpoint ep, ApiError* e) {
  return ParseCompletionRequest(body, ep, e);
}

// The field a rejected body names (param), or "<accepted>".
std::string Rejects(const json& body, Endpoint ep = Endpoint::kCompletions) {
  ApiError e;
  if (Parse(body.dump(), ep, &e)) return "<accepted>";
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_NE(e.message.find(e.param), std::string::npos) << e.message;
  return e.param;
}

TEST(ServeRequest, MalformedJsonAndNonObjects) {
  for (const char* body : {"{\"prompt\": ", "", "[1]", "\"x\"", "null"}) {
    ApiError e;
    EXPECT_FALSE(Parse(body, Endpoint::kCompletions, &e)) << body;
    EXPECT_EQ(e.status, 400);
    EXPECT_TRUE(e.param.empty());
    EXPECT_FALSE(e.message.empty());
  }
}

// A body nested a million levels deep is a 400, not a stack overflow while printing it.
TEST(ServeRequest, DeeplyNestedBodyIsRefused) {
  const int depth = 1000000;
  const std::string body = "{\"prompt\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  ApiError e;
  EXPECT_FALSE(Parse(body, Endpoint::kCompletions, &e));
  EXPECT_EQ(e.param, "prompt[0][0]");
  EXPECT_FALSE(Parse("{\"messages\": [{\"role\": \"user\", \"content\": [" + std::string(depth, '[') +
                         std::string(depth, ']') + "]}]}",
                     Endpoint::kChat, &e));
  EXPECT_EQ(e.param, "messages[0].content[0]");
  EXPECT_FALSE(Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"a\": " +
                         std::string(depth, '[') + std::string(depth, ']') + "}}",
                     Endpoint::kChat, &e));
  EXPECT_EQ(e.param, "chat_template_kwargs");
}

TEST(ServeRequest, CompletionDefaultsAreOpenAis) {
  ApiError e;
  auto r = Parse(R"({"prompt": "hi", "unknown_field": [1, {"x": 2}]})", Endpoint::kCompletions, &e);
  ASSERT_TRUE(r) << e.message;
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(r->prompts[0].text, "hi");
  EXPECT_EQ(r->max_tokens.value(), 16);
  EXPECT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_EQ(r->sampling.top_p, 1.0f);
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_EQ(r->n, 1);
  EXPECT_FALSE(r->logprobs);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->seed.has_value());
}

TEST(ServeRequest, PromptShapes) {
  ApiError e;
  auto ids = Parse(R"({"prompt": [1, 2, 3]})", Endpoint::kCompletions, &e);
  ASSERT_TRUE(ids);
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_TRUE(ids->prompts[0].is_ids);
  EXPECT_EQ(ids->prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  auto list = Parse(R"({"prompt": ["a", "b"]})", Endpoint::kCompletions, &e);
  ASSERT_TRUE(list);
  EXPECT_EQ(list->prompts.size(), 2u);
  auto lists = Parse(R"({"prompt": [[1, 2], [3]]})", Endpoint::kCompletions, &e);
  ASSERT_TRUE(lists);
  EXPECT_EQ(lists->prompts[1].ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(Rejects({{"max_tokens", 3}}), "prompt");
  EXPECT_EQ(Rejects({{"prompt", 5}}), "prompt");
  EXPECT_EQ(Rejects({{"prompt", json::array()}}), "prompt");
  EXPECT_EQ(Rejects({{"prompt", {1, -2}}}), "prompt[1]");
  EXPECT_EQ(Rejects({{"prompt", {1, 1.5}}}), "prompt[1]");
  EXPECT_EQ(Rejects({{"prompt", {"a", 3}}}), "prompt[1]");
  EXPECT_EQ(Rejects({{"prompt", {json::array({1}), json::array()}}}), "prompt[1]");
}

TEST(ServeRequest, WrongTypesAndRangesNameTheField) {
  const json p = {{"prompt", "x"}};
  auto with = [&p](const char* k, json v) {
    json b = p;
    b[k] = std::move(v);
    return b;
  };
  EXPECT_EQ(Rejects(with("temperature", "hot")), "temperature");
  EXPECT_EQ(Rejects(with("temperature", 2.5)), "temperature");
  EXPECT_EQ(Rejects(with("top_p", 0)), "top_p");
  EXPECT_EQ(Rejects(with("min_p", 1.5)), "min_p");
  EXPECT_EQ(Rejects(with("top_k", -2)), "top_k");
  EXPECT_EQ(Rejects(with("max_tokens", -1)), "max_tokens");
  EXPECT_EQ(Rejects(with("max_tokens", 1.5)), "max_tokens");
  EXPECT_EQ(Rejects(with("n", 0)), "n");
  EXPECT_EQ(Rejects(with("n", kMaxChoices + 1)), "n");
  EXPECT_EQ(Rejects(with("logprobs", 21)), "logprobs");
  EXPECT_EQ(Rejects(with("logprobs", true)), "logprobs");
  EXPECT_EQ(Rejects(with("echo", 1)), "echo");
  EXPECT_EQ(Rejects(with("stream", "yes")), "stream");
  EXPECT_EQ(Rejects(with("stream_options", {{"include_usage", 1}})), "stream_options.include_usage");
  EXPECT_EQ(Rejects(with("stop", {"a", 2})), "stop[1]");
  EXPECT_EQ(Rejects(with("stop", 3)), "stop");
  EXPECT_EQ(Rejects(with("seed", "7")), "seed");
  EXPECT_EQ(Rejects(with("presence_penalty", 2.5)), "presence_penalty");
  EXPECT_EQ(Rejects(with("presence_penalty", "high")), "presence_penalty");
  EXPECT_EQ(Rejects(with("frequency_penalty", 3)), "frequency_penalty");
  EXPECT_EQ(Rejects(with("frequency_penalty", -2.01)), "frequency_penalty");
  EXPECT_EQ(Rejects(with("repetition_penalty", 0)), "repetition_penalty");
  EXPECT_EQ(Rejects(with("suffix", "end")), "suffix");
  EXPECT_EQ(Rejects(with("model", 3)), "model");
  // null is "not given", as OpenAI treats it.
  EXPECT_EQ(Rejects(with("temperature", nullptr)), "<accepted>");
  EXPECT_EQ(Rejects(with("presence_penalty", 0)), "<accepted>");
}

// OpenAI's penalties, [-2, 2] each, reach the sampling options; absent they are 0.
TEST(ServeRequest, PresenceAndFrequencyPenalties) {
  ApiError e;
  auto r = Parse(R"({"prompt": "x", "presence_penalty": 1.5, "frequency_penalty": -2})", Endpoint::kCompletions, &e);
  ASSERT_TRUE(r) << e.message;
  EXPECT_EQ(r->sampling.presence_penalty, 1.5f);
  EXPECT_EQ(r->sampling.frequency_penalty, -2.0f);
  auto chat = Parse(R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 2})", Endpoint::kChat, &e);
  ASSERT_TRUE(chat) << e.message;
  EXPECT_EQ(chat->sampling.frequency_penalty, 2.0f);
  EXPECT_EQ(chat->sampling.presence_penalty, 0.0f);
  ApiError range;
  EXPECT_FALSE(Parse(R"({"prompt": "x", "presence_penalty": 2.5})", Endpoint::kCompletions, &range));
  EXPECT_EQ(range.message, "`presence_penalty` must be in [-2.0, 2.0], got 2.5");
}

TEST(ServeRequest, StopsSeedsAndLogprobs) {
  ApiError e;
  auto r = Parse(R"({"prompt": "x", "stop": ["a", "", "bc"], "seed": -1, "logprobs": 0, "echo": true,
                     "top_k": -1, "stream": true, "stream_options": {"include_usage": true}})",
                 Endpoint::kCompletions, &e);
  ASSERT_TRUE(r) << e.message;
  EXPECT_EQ(r->stop, (std::vector<std::string>{"a", "bc"}));  // "" means none
  EXPECT_EQ(r->seed.value(), ~0ULL);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 0);
  EXPECT_TRUE(r->echo);
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_TRUE(r->include_usage);
  auto one = Parse(R"({"prompt": "x", "stop": "END"})", Endpoint::kCompletions, &e);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->stop, (std::vector<std::string>{"END"}));
}

TEST(ServeRequest, ChatMessagesAndLimits) {
  ApiError e;
  auto r = Parse(R"({"messages": [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                  {"role": "assistant", "content": null}],
                     "max_tokens": 5, "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3,
                     "chat_template_kwargs": {"enable_thinking": false}})",
                 Endpoint::kChat, &e);
  ASSERT_TRUE(r) << e.message;
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[1].content, "ab");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->max_tokens.value(), 7);  // max_completion_tokens wins
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_EQ(json::parse(r->chat_template_kwargs)["enable_thinking"], false);
  auto dflt = Parse(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::kChat, &e);
  ASSERT_TRUE(dflt);
  EXPECT_FALSE(dflt->max_tokens.has_value());  // until the context is full
  const json msg = json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(Rejects({{"prompt", "x"}}, Endpoint::kChat), "messages");
  EXPECT_EQ(Rejects({{"messages", json::array()}}, Endpoint::kChat), "messages");
  EXPECT_EQ(Rejects({{"messages", {{{"content", "x"}}}}}, Endpoint::kChat), "messages[0].role");
  EXPECT_EQ(Rejects({{"messages", {{{"role", "user"}, {"content", 3}}}}}, Endpoint::kChat), "messages[0].content");
  EXPECT_EQ(Rejects({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, Endpoint::kChat),
            "messages[0].content[0]");
  EXPECT_EQ(Rejects({{"messages", msg}, {"top_logprobs", 2}}, Endpoint::kChat), "top_logprobs");
  EXPECT_EQ(Rejects({{"messages", msg}, {"logprobs", 1}}, Endpoint::kChat), "logprobs");
  EXPECT_EQ(Rejects({{"messages", msg}, {"max_tokens", 0}}, Endpoint::kChat), "max_tokens");
  EXPECT_EQ(Rejects({{"messages", msg}, {"chat_template_kwargs", "x"}}, Endpoint::kChat), "chat_template_kwargs");
}

TEST(ServeRequest, TokenizeAndDetokenize) {
  ApiError e;
  auto t = ParseTokenizeRequest(R"({"content": "hi", "add_special": false, "with_pieces": true})", &e);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->content, "hi");
  EXPECT_FALSE(t->add_special);
  EXPECT_TRUE(t->with_pieces);
  auto v = ParseTokenizeRequest(R"({"prompt": "vllm"})", &e);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->content, "vllm");
  EXPECT_TRUE(v->add_special);
  EXPECT_FALSE(ParseTokenizeRequest(R"({"content": 1})", &e));
  EXPECT_EQ(e.param, "content");
  EXPECT_FALSE(ParseTokenizeRequest(R"({})", &e));
  auto d = ParseDetokenizeRequest(R"({"tokens": [1, 2]})", &e);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": [1, "a"]})", &e));
  EXPECT_EQ(e.param, "tokens[1]");
}

TEST(ServeRequest, ErrorObjectShape) {
  ApiError e = FieldError("n", "must be in [1, 16], got 0");
  e.extra = {{"n_ctx", 512}};
  const json j = ErrorBody(e);
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(j["error"]["n_ctx"], 512);
  EXPECT_EQ(j["error"]["message"], "`n` must be in [1, 16], got 0");
}

TEST(ServeRequest, KeyComparison) {
  EXPECT_TRUE(SafeEqual("abc", "abc"));
  EXPECT_FALSE(SafeEqual("abc", "abd"));
  EXPECT_FALSE(SafeEqual("abc", "abcd"));
  EXPECT_FALSE(SafeEqual("", "a"));
  EXPECT_FALSE(SafeEqual(std::string("a\0b", 3), "a"));
}

}  // namespace
}  // namespace nibble::serve
