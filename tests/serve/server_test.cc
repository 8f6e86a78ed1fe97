// The server in-process (<nibble/serve.h>) with cpp-httplib's client: /health before the model
// is loaded, 429 when the queue is full, draining, the timeout, and a client that closes its
// connection while waiting for a whole response.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <nibble/serve.h>

#include "test_paths.h"

namespace nibble {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

ServeOptions Options() {
  ServeOptions o;
  o.model_dir = nibble_test::EmbeddedModel();
  o.port = 0;
  o.ctx_size = 512;
  o.threads = 1;
  return o;
}

TEST(ServeServer, HealthIs503WhileLoadingThen200) {
  int loading_health = 0, loading_models = 0;
  auto server = Server::Start(Options(), [&](int port) {
    // Called once bound, before the model loads.
    httplib::Client cli("127.0.0.1", port);
    auto h = cli.Get("/health");
    auto m = cli.Get("/v1/models");
    loading_health = h ? h->status : -1;
    loading_models = m ? m->status : -1;
  });
  ASSERT_TRUE(server.ok()) << server.error().message;
  EXPECT_EQ(loading_health, 503);
  EXPECT_EQ(loading_models, 503);
  httplib::Client cli("127.0.0.1", (*server)->port());
  auto h = cli.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ((*server)->context_size(), 512);
  (*server)->Drain();
  (*server)->Wait();
}

TEST(ServeServer, BindErrorNamesHostAndPort) {
  auto first = Server::Start(Options());
  ASSERT_TRUE(first.ok()) << first.error().message;
  ServeOptions o = Options();
  o.port = (*first)->port();
  auto second = Server::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("127.0.0.1:" + std::to_string(o.port)), std::string::npos) << second.error().message;
  (*first)->Drain();
  (*first)->Wait();
}

// Options out of range are refused before anything loads, naming the flag and the range.
TEST(ServeServer, OptionsOutOfRangeAreNamed) {
  const std::vector<std::pair<std::function<void(ServeOptions&)>, std::string>> cases = {
      {[](ServeOptions& o) { o.threads = -1; }, "--threads -1 must be in [0, 1024]"},
      {[](ServeOptions& o) { o.threads = 1025; }, "--threads 1025 must be in [0, 1024]"},
      {[](ServeOptions& o) { o.port = 70000; }, "--port must be in [0, 65535], got 70000"},
      {[](ServeOptions& o) { o.parallel = 0; }, "--parallel must be in [1, 256], got 0"},
  };
  for (const auto& [edit, want] : cases) {
    ServeOptions o = Options();
    edit(o);
    const Status v = ValidateServeOptions(o);
    ASSERT_FALSE(v.ok()) << want;
    EXPECT_NE(v.error().message.find(want), std::string::npos) << v.error().message;
    auto started = Server::Start(o);
    ASSERT_FALSE(started.ok()) << want;
    EXPECT_EQ(started.error().message, v.error().message);
  }
  EXPECT_TRUE(ValidateServeOptions(Options()).ok());
}

// One slot, no queue: a second request while the first runs gets 429 with Retry-After; a SIGTERM
// style drain lets the first finish and refuses new ones with 503.
TEST(ServeServer, QueueFullIs429AndDrainFinishesRunning) {
  ServeOptions o = Options();
  o.parallel = 1;
  o.max_queue = 0;
  auto server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.error().message;
  const int port = (*server)->port();
  const std::string slow = json{{"prompt", "The story"}, {"max_tokens", 480}, {"temperature", 0}}.dump();
  std::atomic<int> first_status{0};
  std::string first_body;
  std::thread first([&] {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    auto r = cli.Post("/v1/completions", slow, "application/json");
    first_body = r ? r->body : "";
    first_status = r ? r->status : -1;
  });
  httplib::Client cli("127.0.0.1", port);
  // Wait for the first request to hold the slot.
  for (int i = 0; i < 500; ++i) {
    auto m = cli.Get("/metrics");
    if (m && m->body.find("\nnibble_active_slots 1\n") != std::string::npos) break;
    std::this_thread::sleep_for(5ms);
  }
  auto busy = cli.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(busy);
  if (first_status.load() == 0) {  // the first still runs (it may finish early at EOS)
    EXPECT_EQ(busy->status, 429) << busy->body;
    EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
    EXPECT_EQ(json::parse(busy->body)["error"]["type"], "rate_limit_error");
  }
  std::thread drain([&] { (*server)->Drain(); });
  // Until the drain thread has run (a loaded host may take longer than any fixed sleep), a POST
  // still sees the full queue (429) or, the first done, a free slot; from then on 503.
  auto post = [&] { return cli.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json"); };
  auto refused = post();
  for (int i = 0; i < 500 && refused && refused->status != 503; ++i) {
    std::this_thread::sleep_for(10ms);
    refused = post();
  }
  if (refused) {  // none when the drain already stopped the listener
    EXPECT_EQ(refused->status, 503) << refused->body;
  }
  first.join();
  drain.join();
  (*server)->Wait();
  EXPECT_EQ(first_status.load(), 200) << first_body;
}

// A request past --timeout is ended at the next step: 504 for a whole response; a stream gets an
// error event and its finish chunk ("abort"), then [DONE].
TEST(ServeServer, TimeoutEndsTheRequest) {
  ServeOptions o = Options();
  o.timeout_seconds = 0.05;
  auto server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.error().message;
  httplib::Client cli("127.0.0.1", (*server)->port());
  cli.set_read_timeout(60, 0);
  const json req = {{"prompt", "The story"}, {"max_tokens", 480}, {"temperature", 0}};
  auto whole = cli.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(whole);
  const json body = json::parse(whole->body);
  if (whole->status == 200) {
    GTEST_SKIP() << "the model ended at EOS within the timeout: " << body.dump();
  }
  EXPECT_EQ(whole->status, 504) << whole->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("--timeout"), std::string::npos);
  json sreq = req;
  sreq["stream"] = true;
  auto streamed = cli.Post("/v1/completions", sreq.dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_NE(streamed->body.find("\"error\""), std::string::npos) << streamed->body;
  EXPECT_NE(streamed->body.find("\"finish_reason\":\"abort\""), std::string::npos);
  EXPECT_NE(streamed->body.find("data: [DONE]"), std::string::npos);
  (*server)->Drain();
  (*server)->Wait();
}

// A metric's value in /metrics text (-1 when absent).
double Metric(httplib::Client& cli, const std::string& name) {
  auto m = cli.Get("/metrics");
  std::smatch match;
  if (!m || !std::regex_search(m->body, match, std::regex("\n" + name + " ([0-9.e+-]+)\n"))) return -1;
  return std::stod(match[1].str());
}

// A client that sends a request for a whole (non-streamed) response and closes its connection
// while the request runs: the sequence is cancelled within a step, its slot freed, long before
// it would have finished (--timeout is 600 s).
TEST(ServeServer, ClosedConnectionCancelsAWholeResponse) {
  ServeOptions o = Options();
  o.parallel = 1;
  auto server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.error().message;
  httplib::Client cli("127.0.0.1", (*server)->port());
  const std::string body = json{{"prompt", "The story"}, {"max_tokens", 480}, {"temperature", 0}}.dump();
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  for (int i = 0; i < 1000 && Metric(cli, "nibble_active_slots") != 1; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(Metric(cli, "nibble_active_slots"), 1);
  const double tokens_at_close = Metric(cli, "nibble_generation_tokens_total");
  close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  while (Metric(cli, "nibble_active_slots") != 0 && std::chrono::steady_clock::now() - t0 < 10s) std::this_thread::sleep_for(5ms);
  const double freed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(Metric(cli, "nibble_active_slots"), 0);
  EXPECT_EQ(Metric(cli, "nibble_cancelled_total"), 1) << "the slot was freed by the end of generation, not the close";
  EXPECT_LT(Metric(cli, "nibble_generation_tokens_total"), 480) << "generated " << tokens_at_close << " before the close";
  EXPECT_LT(freed_ms, 2000);
  // Counted once the handler returned (it may lag the freed slot by a moment).
  std::string metrics;
  for (int i = 0; i < 200 && metrics.find("nibble_requests_total{status=\"499\"} 1") == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(5ms);
    auto m = cli.Get("/metrics");
    metrics = m ? m->body : "";
  }
  EXPECT_NE(metrics.find("nibble_requests_total{status=\"499\"} 1"), std::string::npos) << metrics;
  (*server)->Drain();
  (*server)->Wait();
}

}  // namespace
}  // namespace nibble
