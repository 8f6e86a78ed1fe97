// `nibble serve`'s HTTP front (cpp-httplib): routes, authentication, the OpenAI endpoints over
// the scheduler, /health, /metrics, draining (serve.h).
#include <nibble/serve.h>

#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <nibble/chat.h>
#include <nibble/model.h>

#include "api/model_impl.h"
#include "base/result.h"
#include "serve/server_impl.h"

namespace nibble {

using json = nlohmann::json;
using serve::ApiError;
using serve::SendError;
using serve::SendJson;
using serve::Status503;
using serve::SafeEqual;

Status ValidateServeOptions(const ServeOptions& o) {
  if (o.port < 0 || o.port > 65535) return MakeError("--port must be in [0, 65535], got ", o.port);
  if (o.parallel < 1 || o.parallel > 256) return MakeError("--parallel must be in [1, 256], got ", o.parallel);
  if (o.ctx_size < 0) return MakeError("--ctx_size must be >= 0, got ", o.ctx_size);
  if (o.chunk < 1) return MakeError("--chunk must be >= 1, got ", o.chunk);
  if (o.max_queue < 0) return MakeError("--max_queue must be >= 0, got ", o.max_queue);
  NIBBLE_RETURN_IF_ERROR(CheckThreads(o.threads));
  if (!(o.timeout_seconds > 0)) return MakeError("--timeout must be > 0 seconds, got ", o.timeout_seconds);
  if (o.host.empty()) return MakeError("--host must not be empty");
  return Status::Ok();
}

httplib::Server::HandlerResponse Server::Impl::PreRoute(const httplib::Request& req, httplib::Response& res) {
  using HR = httplib::Server::HandlerResponse;
  if (req.path == "/health") return HR::Unhandled;  // public, also while loading
  if (!opt.api_key.empty()) {
    std::string key = req.get_header_value("X-Api-Key");
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
    if (!SafeEqual(key, opt.api_key)) {
      ApiError e;
      e.status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      e.message = key.empty() ? "missing API key: send `Authorization: Bearer KEY` or `X-Api-Key: KEY`"
                              : "invalid API key";
      SendError(res, e);
      return HR::Handled;
    }
  }
  if (!ready.load()) {
    SendError(res, Status503("the model is loading"));
    return HR::Handled;
  }
  if (draining.load() && req.method == "POST") {
    SendError(res, Status503("the server is shutting down"));
    return HR::Handled;
  }
  return HR::Unhandled;
}

void Server::Impl::Routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) { return PreRoute(req, res); });
  http.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(status_mu);
    ++status_counts[res.status];
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_length_ > 0) return;
    ApiError e;
    e.status = res.status;
    if (res.status == 404) {
      e.type = "not_found_error";
      e.message = "no endpoint " + req.method + " " + req.path;
    } else if (res.status == 413) {
      e.code = "request_too_large";
      e.message = "the request body exceeds " + std::to_string(opt.max_body_bytes) + " bytes";
    } else {
      e.message = "HTTP " + std::to_string(res.status);
    }
    SendError(res, e);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      e.message = std::string("internal error: ") + ex.what();
    } catch (...) {
      e.message = "internal error";
    }
    SendError(res, e);
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!ready.load()) return SendError(res, Status503("the model is loading"));
    if (draining.load()) return SendError(res, Status503("the server is shutting down"));
    SendJson(res, 200, {{"status", "ok"}});
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    SendJson(res, 200, {{"object", "list"},
                        {"data", json::array({{{"id", model_id},
                                               {"object", "model"},
                                               {"created", created},
                                               {"owned_by", "nibble"},
                                               {"max_model_len", n_ctx}}})}});
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completion(req, res, serve::Endpoint::kCompletions);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completion(req, res, serve::Endpoint::kChat);
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { Tokenize(req, res); });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { Detokenize(req, res); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics(), "text/plain; version=0.0.4");
  });
}

Result<std::unique_ptr<Server>> Server::Start(const ServeOptions& options, const std::function<void(int)>& on_listening,
                                              const std::function<Status(const Model&)>& on_loaded) {
  NIBBLE_RETURN_IF_ERROR(ValidateServeOptions(options));
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.opt = options;
  s.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.model_id = !options.alias.empty() ? options.alias : std::filesystem::path(options.model_dir).lexically_normal().filename().string();
  if (s.model_id.empty()) s.model_id = std::filesystem::path(options.model_dir).lexically_normal().parent_path().filename().string();
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end of the process
  // Each waiting or streaming request holds a worker thread; a few more answer /health and /metrics.
  const size_t workers = static_cast<size_t>(options.parallel + options.max_queue + 8);
  s.http.new_task_queue = [workers] { return new httplib::ThreadPool(std::min<size_t>(workers, 512)); };
  s.http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server binds the
  // same port and the two share its connections.
  s.http.set_socket_options([](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.Routes();
  if (options.port == 0) {
    s.port = s.http.bind_to_any_port(options.host);
  } else {
    s.port = s.http.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (s.port <= 0)
    return MakeErrorCode(ErrorCode::kIo, "cannot listen on ", options.host, ":", options.port,
                         " (address in use, not a local address, or not permitted)");
  s.listener = std::thread([&s] {
    s.http.listen_after_bind();
    s.listen_returned.store(true);
  });
  // httplib's stop() does nothing until the listener thread has marked itself running: wait for
  // it, so that a stop (a failed load, a drain) always ends the listener.
  while (!s.http.is_running() && !s.listen_returned.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (on_listening) on_listening(s.port);
  auto fail = [&s](const Error& e) -> Error {
    s.http.stop();
    s.listener.join();
    return e;
  };
  Result<std::unique_ptr<Model>> model = Model::Load(options.model_dir, options.load);
  if (!model.ok()) return fail(model.error());
  s.model = std::move(*model);
  if (on_loaded) {
    if (const Status st = on_loaded(*s.model); !st.ok()) return fail(st.error());
  }
  Result<ChatTemplate> tmpl = LoadChatTemplate(options.model_dir, options.chat_template);
  if (tmpl.ok()) {
    s.tmpl = *tmpl;
    s.eot = EndOfTurnFor(*s.model, *s.tmpl);
  } else if (!options.chat_template.empty() || tmpl.error().code != ErrorCode::kNotFound) {
    return fail(tmpl.error().WithContext("--chat_template"));
  } else {
    s.tmpl_error = "the model has no chat template (tokenizer_config.json chat_template); start the server with --chat_template FILE";
  }
  SessionOptions tiny;
  tiny.context = 1;
  Result<std::unique_ptr<Session>> ts = Session::Create(*s.model, tiny);
  if (!ts.ok()) return fail(ts.error());
  s.tok_session = std::move(*ts);
  if (s.tmpl) s.chat_tok = std::make_unique<ChatTurns>(*s.tok_session, *s.tmpl);
  serve::SchedulerOptions so;
  so.parallel = options.parallel;
  so.ctx_size = options.ctx_size > 0 ? options.ctx_size : DefaultContextSize(*s.model);
  so.ctx_size = std::min(so.ctx_size, s.model->info().max_position_embeddings);
  so.chunk = options.chunk;
  so.max_queue = options.max_queue;
  so.threads = options.threads;
  so.max_memory = options.max_memory;
  so.prefix_cache_bytes = options.prefix_cache_bytes;
  if (const Status st = CheckKvMemory(*s.model, so.ctx_size * options.parallel, options.max_memory); !st.ok())
    return fail(st.error().WithContext("--ctx_size " + std::to_string(so.ctx_size) + " x --parallel " +
                                       std::to_string(options.parallel)));
  s.n_ctx = so.ctx_size;
  s.scheduler = std::make_unique<serve::Scheduler>(*s.model, so);
  s.ready.store(true);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (impl_->http.is_running()) impl_->http.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
  impl_->scheduler.reset();
}

int Server::port() const { return impl_->port; }

int64_t Server::context_size() const { return impl_->n_ctx; }

void Server::Drain() {
  impl_->draining.store(true);
  // Running and queued requests finish; new POSTs get 503 meanwhile.
  while (impl_->in_flight.load() > 0 || impl_->scheduler->active() > 0 || impl_->scheduler->queued() > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  impl_->http.stop();
}

void Server::Wait() {
  if (impl_->listener.joinable()) impl_->listener.join();
  impl_->scheduler->Stop();
}

}  // namespace nibble
