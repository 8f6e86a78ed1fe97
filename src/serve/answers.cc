// The endpoints' answers: completions and chat completions over the scheduler (whole or
// streamed as server-sent events), /tokenize, /detokenize, /metrics.
#include <chrono>
#include <random>

#include "api/model_impl.h"
#include "serve/openai_format.h"
#include "serve/peer_watch.h"
#include "serve/server_impl.h"

namespace nibble {

using json = nlohmann::json;
using serve::ApiError;

namespace serve {

bool SafeEqual(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i)
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

ApiError Status503(const std::string& message) {
  ApiError e;
  e.status = 503;
  e.type = "service_unavailable_error";
  e.message = message;
  return e;
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) { SendJson(res, e.status, ErrorBody(e)); }

namespace {

// Folds one scheduler event into its choice (and the usage).
void Apply(const SeqEvent& ev, const Prepared& p, int n, bool logprobs, Endpoint ep, std::vector<ChoiceResult>& choices,
           Usage& usage) {
  ChoiceResult& c = choices[static_cast<size_t>(ev.index)];
  c.text += ev.token.text;
  if (ev.has_token && logprobs) {
    if (ep == Endpoint::kChat) c.chat_logprobs.push_back(ChatLogprob(ev.token_text, ev.token));
    else c.completion_logprobs.Add(ev.token_text, ev.token);
  }
  if (!ev.done) return;
  c.done = true;
  c.finish_reason = FinishReason(ev.reason);
  c.error = ev.error;
  usage.completion_tokens += ev.completion_tokens;
  if (ev.index % n == 0) usage.cached_tokens += ev.cached_tokens;
  (void)p;
}

// Each choice's start: a completion's echoed prompt (with its logprobs when asked).
std::vector<ChoiceResult> StartChoices(const CompletionRequest& r, const Prepared& p) {
  std::vector<ChoiceResult> choices(p.prompts.size() * static_cast<size_t>(r.n));
  for (size_t i = 0; i < choices.size(); ++i) {
    const size_t k = i / static_cast<size_t>(r.n);
    if (!r.echo) continue;
    choices[i].text = p.echo_texts[k];
    if (r.logprobs)
      for (const TokenEvent& ev : p.echo_logprobs[k]) choices[i].completion_logprobs.Add(ev.text, ev);
  }
  return choices;
}

ApiError ChoiceError(const std::string& message) {
  ApiError e;
  e.status = message.find("--timeout") != std::string::npos ? 504 : 500;
  e.type = "server_error";
  e.message = message;
  return e;
}

// Streams a request's events as OpenAI's server-sent events: the role (chat) or the echoed
// prompt (completions) first, a chunk per token, finish_reason on each choice's last chunk,
// the usage-only chunk when asked, then [DONE].
struct StreamState {
  std::shared_ptr<Channel> channel;
  CompletionRequest request;
  Prepared prepared;
  ResponseHead head;
  int total = 0, done = 0;
  bool started = false, finished = false;
  Usage usage;
  std::vector<int64_t> offsets;  // completions logprobs: bytes before each choice's next token
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  std::atomic<int64_t>* in_flight = nullptr;
  ~StreamState() { --*in_flight; }

  std::string First() {
    std::string out;
    const bool iu = request.include_usage;
    std::vector<ChoiceResult> start = StartChoices(request, prepared);
    for (int i = 0; i < total; ++i) {
      if (head.endpoint == Endpoint::kChat) {
        out += SseData(ChatChunk(head, i, {{"role", "assistant"}, {"content", ""}}, nullptr, "", iu));
      } else if (request.echo) {
        offsets[static_cast<size_t>(i)] = start[static_cast<size_t>(i)].completion_logprobs.offset;
        out += SseData(CompletionChunk(head, i, start[static_cast<size_t>(i)].text,
                                       request.logprobs ? start[static_cast<size_t>(i)].completion_logprobs.Json() : json(nullptr), "", iu));
      }
    }
    return out;
  }

  std::string Event(const SeqEvent& ev) {
    const bool iu = request.include_usage;
    const bool lp = request.logprobs && ev.has_token;
    if (!ev.done && ev.token.text.empty() && !lp) return "";
    std::string out;
    if (ev.done) {
      ++done;
      usage.completion_tokens += ev.completion_tokens;
      if (ev.index % request.n == 0) usage.cached_tokens += ev.cached_tokens;
      if (!ev.error.empty()) out += SseData(ErrorBody(ChoiceError(ev.error)));
    }
    const std::string finish = ev.done ? FinishReason(ev.reason) : "";
    if (head.endpoint == Endpoint::kChat) {
      json delta = ev.token.text.empty() && ev.done ? json::object() : json{{"content", ev.token.text}};
      json logprobs = lp ? json{{"content", json::array({ChatLogprob(ev.token_text, ev.token)})}} : json(nullptr);
      out += SseData(ChatChunk(head, ev.index, delta, logprobs, finish, iu));
    } else {
      json logprobs = nullptr;
      if (lp) {
        CompletionLogprobs one;
        one.offset = offsets[static_cast<size_t>(ev.index)];
        one.Add(ev.token_text, ev.token);
        offsets[static_cast<size_t>(ev.index)] = one.offset;
        logprobs = one.Json();
      }
      out += SseData(CompletionChunk(head, ev.index, ev.token.text, logprobs, finish, iu));
    }
    return out;
  }

  // httplib's chunked content provider: false ends the response (the client is gone).
  bool Provide(httplib::DataSink& sink) {
    auto write = [&](const std::string& s) {
      if (s.empty()) return true;
      last_write = std::chrono::steady_clock::now();
      return sink.write(s.data(), s.size());
    };
    if (!started) {
      started = true;
      if (!write(First())) return Gone();
    }
    while (done < total) {
      SeqEvent ev;
      if (!channel->Pop(&ev, std::chrono::milliseconds(200))) {
        // An SSE comment now and then: a client that went away while its request waits is
        // noticed by the failed write.
        if (std::chrono::steady_clock::now() - last_write > std::chrono::seconds(1) && !write(": keep-alive\n\n"))
          return Gone();
        return true;
      }
      if (!write(Event(ev))) return Gone();
    }
    std::string tail = request.include_usage ? SseData(UsageChunk(head, usage)) : "";
    tail += "data: [DONE]\n\n";
    if (!write(tail)) return Gone();
    finished = true;
    sink.done();
    return true;
  }
  bool Gone() {
    channel->Cancel();
    return false;
  }
};

}  // namespace
}  // namespace serve

bool Server::Impl::PromptIds(const serve::CompletionRequest& r, serve::Prepared* p, ApiError* e) {
  if (r.endpoint == serve::Endpoint::kChat) {
    if (!chat_tok) {
      *e = serve::FieldError("messages", tmpl_error);
      return false;
    }
    Result<std::string> text = RenderChat(*tmpl, r.messages, true, r.chat_template_kwargs);
    if (!text.ok()) {
      *e = serve::FieldError("messages", "the chat template refused them: " + text.error().message);
      return false;
    }
    Result<std::vector<int32_t>> ids = chat_tok->Tokenize(*text);
    if (!ids.ok()) {
      *e = serve::FieldError("messages", ids.error().message);
      return false;
    }
    p->prompts.push_back(std::move(*ids));
    return true;
  }
  const int64_t vocab = model->info().vocab_size;
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const serve::PromptInput& in = r.prompts[i];
    const std::string field = r.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]";
    if (in.is_ids) {
      for (size_t k = 0; k < in.ids.size(); ++k)
        if (in.ids[k] >= vocab) {
          *e = serve::FieldError(field, "token " + std::to_string(k) + " is id " + std::to_string(in.ids[k]) +
                                            ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
          return false;
        }
      p->prompts.push_back(in.ids);
      p->echo_texts.push_back(model->Detokenize(in.ids));
      continue;
    }
    Result<std::vector<int32_t>> ids = model->Tokenize(in.text);
    if (!ids.ok()) {
      *e = serve::FieldError(field, ids.error().message);
      return false;
    }
    if (ids->empty()) {
      *e = serve::FieldError(field, "is empty and the tokenizer adds no BOS token: nothing to start from");
      return false;
    }
    p->prompts.push_back(std::move(*ids));
    p->echo_texts.push_back(in.text);
  }
  return true;
}

// The prompts' ids, checked against the context (a 400 naming n_prompt_tokens and n_ctx), the
// generation limit per prompt, the stop strings and ids, and the echo's prompt logprobs.
bool Server::Impl::Prepare(const serve::CompletionRequest& r, serve::Prepared* p, ApiError* e) {
  if (!PromptIds(r, p, e)) return false;
  for (const std::vector<int32_t>& ids : p->prompts) {
    const auto n_prompt = static_cast<int64_t>(ids.size());
    const int64_t want = r.max_tokens.value_or(0);
    if (n_prompt + (r.max_tokens ? want : 1) > n_ctx) {
      e->code = "context_length_exceeded";
      e->param = r.endpoint == serve::Endpoint::kChat ? "messages" : "prompt";
      e->message = "the request needs " + std::to_string(n_prompt + (r.max_tokens ? want : 1)) + " positions (n_prompt_tokens " +
                   std::to_string(n_prompt) + " + max_tokens " + (r.max_tokens ? std::to_string(want) : std::string("1")) +
                   "), more than the context n_ctx " + std::to_string(n_ctx);
      e->extra = {{"n_prompt_tokens", n_prompt}, {"n_ctx", n_ctx}};
      return false;
    }
    p->max_tokens.push_back(r.max_tokens ? want : n_ctx - n_prompt);
    if (r.echo && r.logprobs) {
      Result<std::vector<TokenEvent>> lp = PromptLogprobs(*model, ids, r.top_logprobs);
      if (!lp.ok()) {
        e->status = 500;
        e->type = "server_error";
        e->message = "prompt logprobs: " + lp.error().message;
        return false;
      }
      p->echo_logprobs.push_back(std::move(*lp));
    }
  }
  p->stop = r.stop;
  if (r.endpoint == serve::Endpoint::kChat) {
    p->stop.insert(p->stop.end(), eot.markers.begin(), eot.markers.end());
    p->stop_ids = eot.ids;
  }
  return true;
}

std::vector<serve::SeqJob> Server::Impl::Jobs(const serve::CompletionRequest& r, const serve::Prepared& p,
                                              const std::shared_ptr<serve::Channel>& ch) const {
  std::vector<serve::SeqJob> jobs;
  static thread_local std::mt19937_64 rng(std::random_device{}());
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(opt.timeout_seconds));
  for (size_t k = 0; k < p.prompts.size(); ++k) {
    if (p.max_tokens[k] == 0) continue;
    for (int i = 0; i < r.n; ++i) {
      serve::SeqJob j;
      j.prompt = p.prompts[k];
      j.max_tokens = p.max_tokens[k];
      j.sampling = r.sampling;
      // Choice i of a seeded request samples with seed + i: n choices differ, a repeat is identical.
      j.sampling.seed = r.seed ? *r.seed + static_cast<uint64_t>(i) : rng();
      j.stop = p.stop;
      j.stop_ids = p.stop_ids;
      j.logprobs = r.logprobs;
      j.top_logprobs = r.top_logprobs;
      j.index = static_cast<int>(k) * r.n + i;
      j.channel = ch;
      j.deadline = deadline;
      jobs.push_back(std::move(j));
    }
  }
  return jobs;
}

void Server::Impl::Completion(const httplib::Request& req, httplib::Response& res, serve::Endpoint ep) {
  ++in_flight;
  std::shared_ptr<void> done_guard(nullptr, [this](void*) { --in_flight; });
  ApiError e;
  std::optional<serve::CompletionRequest> r = serve::ParseCompletionRequest(req.body, ep, &e);
  serve::Prepared p;
  if (!r || !Prepare(*r, &p, &e)) return serve::SendError(res, e);
  auto channel = std::make_shared<serve::Channel>();
  std::vector<serve::SeqJob> jobs = Jobs(*r, p, channel);
  const int total = static_cast<int>(p.prompts.size()) * r->n;
  if (!jobs.empty() && !scheduler->Submit(std::move(jobs))) {
    e.status = 429;
    e.type = "rate_limit_error";
    e.code = "queue_full";
    e.message = "the server's queue is full (--max_queue " + std::to_string(opt.max_queue) + "); retry later";
    res.set_header("Retry-After", "1");
    return serve::SendError(res, e);
  }
  for (size_t k = 0; k < p.prompts.size(); ++k)  // max_tokens 0: scoring only, nothing to run
    if (p.max_tokens[k] == 0)
      for (int i = 0; i < r->n; ++i) {
        serve::SeqEvent ev;
        ev.index = static_cast<int>(k) * r->n + i;
        ev.done = true;
        channel->Push(std::move(ev));
      }
  serve::ResponseHead head;
  head.id = serve::NewId(ep == serve::Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  head.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  head.model = model_id;
  head.endpoint = ep;
  head.logprobs = r->logprobs;
  serve::Usage usage;
  for (const auto& ids : p.prompts) usage.prompt_tokens += static_cast<int64_t>(ids.size());
  if (r->stream) {
    auto st = std::make_shared<serve::StreamState>();
    st->in_flight = &in_flight;
    ++in_flight;  // the stream's own, released with its state
    st->channel = channel;
    st->head = head;
    st->total = total;
    st->usage = usage;
    st->offsets.assign(static_cast<size_t>(total), 0);
    st->request = std::move(*r);
    st->prepared = std::move(p);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [st](size_t, httplib::DataSink& sink) { return st->Provide(sink); },
        [st](bool) {
          if (!st->finished) st->channel->Cancel();
        });
    return;
  }
  std::vector<serve::ChoiceResult> choices = serve::StartChoices(*r, p);
  // Nothing is written before the end, so a client that goes away is watched for: its sequences
  // end at the scheduler's next step (and queued ones are dropped), as a stream's failed write does.
  const serve::PeerWatch peer(req);
  for (int done = 0; done < total;) {
    serve::SeqEvent ev;
    const bool got = channel->Pop(&ev, std::chrono::milliseconds(20));
    if (peer.Closed()) {
      channel->Cancel();
      ApiError gone;
      gone.status = 499;  // nginx's "client closed request": counted in /metrics, never read
      gone.message = "the client closed the connection";
      return serve::SendError(res, gone);
    }
    if (!got) continue;
    done += ev.done ? 1 : 0;
    serve::Apply(ev, p, r->n, r->logprobs, ep, choices, usage);
  }
  for (const serve::ChoiceResult& c : choices)
    if (!c.error.empty()) return serve::SendError(res, serve::ChoiceError(c.error));
  serve::SendJson(res, 200, serve::FullResponse(head, choices, usage));
}

void Server::Impl::Tokenize(const httplib::Request& req, httplib::Response& res) {
  ApiError e;
  std::optional<serve::TokenizeRequest> r = serve::ParseTokenizeRequest(req.body, &e);
  if (!r) return serve::SendError(res, e);
  const Tokenizer& tok = ModelAccess::tokenizer(*model);
  Result<std::vector<int32_t>> ids = tok.Encode(r->content, r->add_special);
  if (!ids.ok()) return serve::SendError(res, serve::FieldError("content", ids.error().message));
  json tokens = json::array();
  for (int32_t id : *ids) {
    if (r->with_pieces) tokens.push_back({{"id", id}, {"piece", tok.Piece(id)}});
    else tokens.push_back(id);
  }
  serve::SendJson(res, 200, {{"tokens", tokens}, {"count", ids->size()}, {"max_model_len", n_ctx}});
}

void Server::Impl::Detokenize(const httplib::Request& req, httplib::Response& res) {
  ApiError e;
  std::optional<std::vector<int32_t>> ids = serve::ParseDetokenizeRequest(req.body, &e);
  if (!ids) return serve::SendError(res, e);
  const int64_t vocab = model->info().vocab_size;
  for (size_t k = 0; k < ids->size(); ++k)
    if ((*ids)[k] >= vocab)
      return serve::SendError(res, serve::FieldError("tokens[" + std::to_string(k) + "]", "is " + std::to_string((*ids)[k]) +
                                                                                           ", outside the vocabulary [0, " +
                                                                                           std::to_string(vocab) + ")"));
  const std::string text = model->Detokenize(*ids);
  serve::SendJson(res, 200, {{"content", text}, {"prompt", text}});
}

std::string Server::Impl::Metrics() {
  const serve::SchedulerCounters& c = scheduler->counters();
  std::string out;
  auto metric = [&out](const char* name, const char* type, const char* help, const std::string& value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + value + "\n";
  };
  out += "# HELP nibble_requests_total HTTP requests answered, by status.\n# TYPE nibble_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lock(status_mu);
    for (const auto& [status, n] : status_counts)
      out += "nibble_requests_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
  }
  const double busy = static_cast<double>(c.busy_micros.load()) / 1e6;
  metric("nibble_prompt_tokens_total", "counter", "Prompt tokens computed (prefix-cache hits not included).",
         std::to_string(c.prompt_tokens.load()));
  metric("nibble_prompt_tokens_cached_total", "counter", "Prompt tokens served by the prefix cache.",
         std::to_string(c.cached_tokens.load()));
  metric("nibble_generation_tokens_total", "counter", "Tokens generated.", std::to_string(c.generated_tokens.load()));
  metric("nibble_queue_depth", "gauge", "Sequences waiting for a slot.", std::to_string(scheduler->queued()));
  metric("nibble_active_slots", "gauge", "Sequences running.", std::to_string(scheduler->active()));
  metric("nibble_batch_tokens", "gauge", "Rows (tokens) of the last batched step.", std::to_string(c.last_batch_tokens.load()));
  metric("nibble_steps_total", "counter", "Batched steps run.", std::to_string(c.steps.load()));
  metric("nibble_step_tokens_total", "counter", "Rows of all batched steps.", std::to_string(c.step_tokens.load()));
  metric("nibble_step_seconds_total", "counter", "Time spent in batched steps.", std::to_string(busy));
  metric("nibble_generation_tokens_per_second", "gauge", "Tokens generated per second of step time.",
         std::to_string(busy > 0 ? static_cast<double>(c.generated_tokens.load()) / busy : 0.0));
  metric("nibble_prefix_cache_hits_total", "counter", "Sequences that started from a cached prefix.",
         std::to_string(c.cache_hits.load()));
  metric("nibble_prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.", std::to_string(scheduler->cache().bytes()));
  metric("nibble_cancelled_total", "counter", "Sequences ended by a client that went away or a timeout.",
         std::to_string(c.cancelled.load()));
  return out;
}

}  // namespace nibble
