// The server's state shared by its translation units: server.cc (routes, start, drain) and
// answers.cc (the endpoints' answers).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <nibble/chat.h>
#include <nibble/serve.h>

#include "serve/request.h"
#include "serve/scheduler.h"

namespace nibble {

namespace serve {

/// What a request runs once checked against the model: its prompts' ids and the limits.
struct Prepared {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_texts;                 // completions' echo: each prompt's text
  std::vector<std::vector<TokenEvent>> echo_logprobs;  // echo with logprobs: each prompt's token logprobs
  std::vector<int64_t> max_tokens;                     // per prompt, within the context
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
};

/// Whether two keys are equal, in time that depends only on their lengths.
bool SafeEqual(const std::string& a, const std::string& b);
ApiError Status503(const std::string& message);
void SendJson(httplib::Response& res, int status, const nlohmann::json& body);
void SendError(httplib::Response& res, const ApiError& e);

}  // namespace serve

struct Server::Impl {
  ServeOptions opt;
  httplib::Server http;
  std::thread listener;
  int port = 0;
  int64_t n_ctx = 0;
  std::unique_ptr<Model> model;
  std::unique_ptr<serve::Scheduler> scheduler;
  std::optional<ChatTemplate> tmpl;
  std::string tmpl_error;
  EndOfTurn eot;
  std::unique_ptr<Session> tok_session;  // only for ChatTurns::Tokenize (one BOS)
  std::unique_ptr<ChatTurns> chat_tok;
  std::string model_id;
  int64_t created = 0;
  std::atomic<bool> ready{false}, draining{false};
  std::atomic<bool> listen_returned{false};  // the listener thread's listen_after_bind returned
  std::atomic<int64_t> in_flight{0};
  std::mutex status_mu;
  std::map<int, int64_t> status_counts;

  void Routes();
  httplib::Server::HandlerResponse PreRoute(const httplib::Request& req, httplib::Response& res);
  void Completion(const httplib::Request& req, httplib::Response& res, serve::Endpoint ep);
  bool Prepare(const serve::CompletionRequest& r, serve::Prepared* p, serve::ApiError* e);
  bool PromptIds(const serve::CompletionRequest& r, serve::Prepared* p, serve::ApiError* e);
  std::vector<serve::SeqJob> Jobs(const serve::CompletionRequest& r, const serve::Prepared& p,
                                  const std::shared_ptr<serve::Channel>& ch) const;
  void Tokenize(const httplib::Request& req, httplib::Response& res);
  void Detokenize(const httplib::Request& req, httplib::Response& res);
  std::string Metrics();
};

}  // namespace nibble
