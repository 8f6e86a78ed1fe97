// OpenAI request bodies → CompletionRequest (request.h).
#include "serve/request.h"

#include <cmath>
#include <limits>

namespace nibble::serve {

using json = nlohmann::json;

json ErrorBody(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  for (const auto& [k, v] : e.extra.items()) err[k] = v;
  return json{{"error", err}};
}

ApiError FieldError(const std::string& field, const std::string& what) {
  ApiError e;
  e.message = "`" + field + "` " + what;
  e.param = field;
  return e;
}

namespace {

// The member `key` of `o` unless absent or null (OpenAI treats null as "not given").
const json* Find(const json& o, const char* key) {
  const auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string Shown(const json& v) {
  // Arrays and objects are not printed: a deeply nested one would recurse as deep to print.
  if (v.is_array()) return "[...] (" + std::to_string(v.size()) + " items)";
  if (v.is_object()) return "{...}";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 64 ? s.substr(0, 61) + "..." : s;
}

bool WrongType(const std::string& key, const char* expected, const json& v, ApiError* e) {
  *e = FieldError(key, std::string("must be ") + expected + ", got " + v.type_name() + " " + Shown(v));
  return false;
}

// A number in [lo, hi] (lo excluded when lo_open).
bool GetNumber(const json& o, const char* key, double lo, double hi, bool lo_open, float* out, ApiError* e) {
  const json* v = Find(o, key);
  if (v == nullptr) return true;
  if (!v->is_number()) return WrongType(key, "a number", *v, e);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) {
    *e = FieldError(key, "must be in " + std::string(lo_open ? "(" : "[") + Shown(json(lo)) + ", " +
                             (std::isinf(hi) ? std::string("inf)") : Shown(json(hi)) + "]") + ", got " + Shown(*v));
    return false;
  }
  *out = static_cast<float>(x);
  return true;
}

bool GetInt(const json& o, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out, ApiError* e) {
  const json* v = Find(o, key);
  if (v == nullptr) return true;
  if (!v->is_number_integer()) return WrongType(key, "an integer", *v, e);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return WrongType(key, "an integer in the int64 range", *v, e);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    *e = FieldError(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
    return false;
  }
  *out = x;
  return true;
}

bool GetBool(const json& o, const char* key, bool* out, ApiError* e) {
  const json* v = Find(o, key);
  if (v == nullptr) return true;
  if (!v->is_boolean()) return WrongType(key, "a boolean", *v, e);
  *out = v->get<bool>();
  return true;
}

bool GetString(const json& o, const char* key, std::string* out, ApiError* e) {
  const json* v = Find(o, key);
  if (v == nullptr) return true;
  if (!v->is_string()) return WrongType(key, "a string", *v, e);
  *out = v->get<std::string>();
  return true;
}

bool GetTokenIds(const json& v, const std::string& key, std::vector<int32_t>* out, ApiError* e) {
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return WrongType(key + "[" + std::to_string(i) + "]", "a token id (an integer >= 0)", t, e);
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

// string | [string] | [int] | [[int]]
bool GetPrompts(const json& o, std::vector<PromptInput>* out, ApiError* e) {
  const json* v = Find(o, "prompt");
  if (v == nullptr) {
    *e = FieldError("prompt", "is required");
    return false;
  }
  const char* shape = "a string, an array of strings, an array of token ids or an array of arrays of token ids";
  if (v->is_string()) {
    out->push_back({v->get<std::string>(), {}, false});
    return true;
  }
  if (!v->is_array() || v->empty()) return WrongType("prompt", shape, *v, e);
  if ((*v)[0].is_number()) {
    PromptInput p;
    p.is_ids = true;
    if (!GetTokenIds(*v, "prompt", &p.ids, e)) return false;
    out->push_back(std::move(p));
    return true;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    const std::string key = "prompt[" + std::to_string(i) + "]";
    PromptInput p;
    if (item.is_string()) {
      p.text = item.get<std::string>();
    } else if (item.is_array() && !item.empty()) {
      p.is_ids = true;
      if (!GetTokenIds(item, key, &p.ids, e)) return false;
    } else {
      return WrongType(key, "a string or a non-empty array of token ids", item, e);
    }
    out->push_back(std::move(p));
  }
  return true;
}

bool GetStops(const json& o, std::vector<std::string>* out, ApiError* e) {
  const json* v = Find(o, "stop");
  if (v == nullptr) return true;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out->push_back(v->get<std::string>());
    return true;
  }
  if (!v->is_array()) return WrongType("stop", "a string or an array of strings", *v, e);
  if (v->size() > static_cast<size_t>(kMaxStops)) {
    *e = FieldError("stop", "may hold at most " + std::to_string(kMaxStops) + " strings, got " + std::to_string(v->size()));
    return false;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) return WrongType("stop[" + std::to_string(i) + "]", "a string", (*v)[i], e);
    // An empty stop string would match at once; OpenAI clients send "" for "none".
    if (!(*v)[i].get<std::string>().empty()) out->push_back((*v)[i].get<std::string>());
  }
  return true;
}

bool GetMessages(const json& o, std::vector<ChatMessage>* out, ApiError* e) {
  const json* v = Find(o, "messages");
  if (v == nullptr) {
    *e = FieldError("messages", "is required");
    return false;
  }
  if (!v->is_array() || v->empty()) return WrongType("messages", "a non-empty array of messages", *v, e);
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string key = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(key, "an object", m, e);
    ChatMessage msg;
    const json* role = Find(m, "role");
    if (role == nullptr || !role->is_string()) return WrongType(key + ".role", "a string", role ? *role : json(nullptr), e);
    msg.role = role->get<std::string>();
    const json* content = Find(m, "content");
    if (content != nullptr && content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content != nullptr && content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pkey = key + ".content[" + std::to_string(k) + "]";
        const json* type = part.is_object() ? Find(part, "type") : nullptr;
        const json* text = part.is_object() ? Find(part, "text") : nullptr;
        if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
          *e = FieldError(pkey, "must be a text part {\"type\": \"text\", \"text\": ...} (only text is supported), got " + Shown(part));
          return false;
        }
        msg.content += text->get<std::string>();
      }
    } else if (content != nullptr) {
      return WrongType(key + ".content", "a string or an array of text parts", *content, e);
    }
    out->push_back(std::move(msg));
  }
  return true;
}

// Whether `v` nests deeper than `max` levels, without recursing.
bool NestsDeeper(const json& v, int max) {
  std::vector<std::pair<const json*, int>> todo = {{&v, 1}};
  while (!todo.empty()) {
    const auto [j, depth] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    if (depth > max) return true;
    for (const json& child : *j) todo.push_back({&child, depth + 1});
  }
  return false;
}

bool GetSampling(const json& o, CompletionRequest* r, ApiError* e) {
  SamplingOptions& s = r->sampling;
  s.temperature = 1.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  s.repeat_penalty = 1.0f;
  s.repeat_last_n = -1;
  if (!GetNumber(o, "temperature", 0, 2, false, &s.temperature, e)) return false;
  if (!GetNumber(o, "top_p", 0, 1, true, &s.top_p, e)) return false;
  if (!GetNumber(o, "min_p", 0, 1, false, &s.min_p, e)) return false;
  if (!GetNumber(o, "repetition_penalty", 0, std::numeric_limits<double>::infinity(), true, &s.repeat_penalty, e))
    return false;
  std::optional<int64_t> top_k, seed;
  if (!GetInt(o, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k, e)) return false;
  if (top_k) s.top_k = *top_k < 0 ? 0 : *top_k;  // vLLM's -1 = off
  if (!GetInt(o, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed, e)) return false;
  if (seed) r->seed = static_cast<uint64_t>(*seed);
  // OpenAI's penalties over the choice's own generated tokens (Session::Sample), in OpenAI's range.
  return GetNumber(o, "presence_penalty", -2, 2, false, &s.presence_penalty, e) &&
         GetNumber(o, "frequency_penalty", -2, 2, false, &s.frequency_penalty, e);
}

bool GetLogprobs(const json& o, CompletionRequest* r, ApiError* e) {
  if (r->endpoint == Endpoint::kCompletions) {
    std::optional<int64_t> lp;
    if (!GetInt(o, "logprobs", 0, kMaxTopLogprobs, &lp, e)) return false;
    r->logprobs = lp.has_value();
    r->top_logprobs = static_cast<int>(lp.value_or(0));
    return GetBool(o, "echo", &r->echo, e);
  }
  if (!GetBool(o, "logprobs", &r->logprobs, e)) return false;
  std::optional<int64_t> top;
  if (!GetInt(o, "top_logprobs", 0, kMaxTopLogprobs, &top, e)) return false;
  if (top && *top > 0 && !r->logprobs) {
    *e = FieldError("top_logprobs", "needs `logprobs` true");
    return false;
  }
  r->top_logprobs = static_cast<int>(top.value_or(0));
  return true;
}

bool GetStream(const json& o, CompletionRequest* r, ApiError* e) {
  if (!GetBool(o, "stream", &r->stream, e)) return false;
  const json* so = Find(o, "stream_options");
  if (so == nullptr) return true;
  if (!so->is_object()) return WrongType("stream_options", "an object", *so, e);
  const json* iu = Find(*so, "include_usage");
  if (iu == nullptr) return true;
  if (!iu->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *iu, e);
  r->include_usage = iu->get<bool>();
  return true;
}

bool GetMaxTokens(const json& o, CompletionRequest* r, ApiError* e) {
  const int64_t max = std::numeric_limits<int32_t>::max();
  if (r->endpoint == Endpoint::kCompletions) {
    r->max_tokens = 16;  // OpenAI's default for completions
    return GetInt(o, "max_tokens", 0, max, &r->max_tokens, e);
  }
  std::optional<int64_t> mt, mct;
  if (!GetInt(o, "max_tokens", 1, max, &mt, e) || !GetInt(o, "max_completion_tokens", 1, max, &mct, e)) return false;
  r->max_tokens = mct ? mct : mt;
  return true;
}

}  // namespace

std::optional<json> ParseBodyObject(std::string_view body, ApiError* error) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    error->message = "the request body is not valid JSON";
    return std::nullopt;
  }
  if (!j.is_object()) {
    error->message = std::string("the request body must be a JSON object, got ") + j.type_name();
    return std::nullopt;
  }
  return j;
}

std::optional<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint, ApiError* e) {
  std::optional<json> j = ParseBodyObject(body, e);
  if (!j) return std::nullopt;
  CompletionRequest r;
  r.endpoint = endpoint;
  std::optional<int64_t> n;
  std::string suffix;
  bool ok = GetString(*j, "model", &r.model, e) &&
            (endpoint == Endpoint::kCompletions ? GetPrompts(*j, &r.prompts, e) : GetMessages(*j, &r.messages, e)) &&
            GetMaxTokens(*j, &r, e) && GetSampling(*j, &r, e) && GetStops(*j, &r.stop, e) &&
            GetInt(*j, "n", 1, kMaxChoices, &n, e) && GetLogprobs(*j, &r, e) && GetStream(*j, &r, e) &&
            (endpoint == Endpoint::kChat || GetString(*j, "suffix", &suffix, e));
  if (ok && !suffix.empty()) {
    *e = FieldError("suffix", "is not supported (insertion needs a fill-in-the-middle model)");
    ok = false;
  }
  if (ok && endpoint == Endpoint::kChat) {
    if (const json* kw = Find(*j, "chat_template_kwargs")) {
      if (!kw->is_object()) {
        ok = WrongType("chat_template_kwargs", "an object", *kw, e);
      } else if (NestsDeeper(*kw, 32)) {
        *e = FieldError("chat_template_kwargs", "nests deeper than 32 levels");
        ok = false;
      } else {
        r.chat_template_kwargs = kw->dump();
      }
    }
  }
  if (!ok) return std::nullopt;
  r.n = static_cast<int>(n.value_or(1));
  if (static_cast<int64_t>(r.prompts.size()) * r.n > 4 * kMaxChoices) {
    *e = FieldError("prompt", "times `n` gives " + std::to_string(r.prompts.size() * r.n) + " choices; at most " +
                                  std::to_string(4 * kMaxChoices) + " per request");
    return std::nullopt;
  }
  return r;
}

std::optional<TokenizeRequest> ParseTokenizeRequest(std::string_view body, ApiError* e) {
  std::optional<json> j = ParseBodyObject(body, e);
  if (!j) return std::nullopt;
  TokenizeRequest r;
  const char* key = Find(*j, "content") != nullptr ? "content" : "prompt";
  if (Find(*j, key) == nullptr) {
    *e = FieldError("content", "is required (the text to tokenize; vLLM's `prompt` is read too)");
    return std::nullopt;
  }
  const char* special = Find(*j, "add_special") != nullptr ? "add_special" : "add_special_tokens";
  if (!GetString(*j, key, &r.content, e) || !GetBool(*j, special, &r.add_special, e) ||
      !GetBool(*j, "with_pieces", &r.with_pieces, e))
    return std::nullopt;
  return r;
}

std::optional<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, ApiError* e) {
  std::optional<json> j = ParseBodyObject(body, e);
  if (!j) return std::nullopt;
  const json* t = Find(*j, "tokens");
  if (t == nullptr) {
    *e = FieldError("tokens", "is required (an array of token ids)");
    return std::nullopt;
  }
  if (!t->is_array()) {
    WrongType("tokens", "an array of token ids", *t, e);
    return std::nullopt;
  }
  std::vector<int32_t> ids;
  if (!GetTokenIds(*t, "tokens", &ids, e)) return std::nullopt;
  return ids;
}

}  // namespace nibble::serve
