// How the server ends (server/shutdown.h), with real signals sent to this process (blocked in
// every thread, as `megadecode serve` blocks them, so only sigtimedwait sees them):
//   - SIGTERM with requests in flight: /health and new requests get 503 at once, short requests
//     finish normally, the rest end at the drain timeout with an error event and [DONE] (streams)
//     or an error body, and the outcome is exit code 0;
//   - a second signal ends the drain at once;
//   - a backend that fails mid-step (an Error, or the typed DeviceError a CUDA backend throws for
//     a sticky fault) ends every request with an error (event or 500 body), turns /health to 503,
//     and the outcome is exit code 1.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>

#include <future>

#include "server/shutdown.h"
#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::HttpResult;
using testing::TestServer;
using testing::TestServerOptions;
using testing::wait_until;
using Clock = std::chrono::steady_clock;

// SIGINT and SIGTERM blocked in this thread and every thread started while it lives; what is
// still pending at the end is consumed before the old mask returns.
struct BlockedSignals {
  BlockedSignals() {
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
  }
  ~BlockedSignals() {
    const timespec zero{0, 0};
    while (sigtimedwait(&set, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  sigset_t set, old;
};

// A request on its own connection and thread; get() waits for the whole response.
std::future<HttpResult> send(int port, json body) {
  return std::async(std::launch::async, [port, body] {
    HttpClient c(port);
    return c.request("POST", "/v1/completions", body.dump());
  });
}

json request_body(const std::string& prompt, int max_tokens, bool stream) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", stream}};
}

// The error event of a stream (the `data:` payload holding "error"), or null.
json error_event(const std::vector<std::string>& events) {
  for (const std::string& e : events) {
    json j = json::parse(e, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("error")) return j;
  }
  return nullptr;
}

std::string finish_reason(const std::vector<std::string>& events) {
  for (const std::string& e : events) {
    json j = json::parse(e, nullptr, false);
    if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
    if (j["choices"][0]["finish_reason"].is_string()) return j["choices"][0]["finish_reason"];
  }
  return "";
}

TEST(Shutdown, SigtermDrainsInFlightRequestsThenEndsTheRest) {
  BlockedSignals signals;
  TestServerOptions o;
  o.backend_delay_us = 8000;  // every backend call: a 500-token request takes 4 s at least
  TestServer server(o);
  ShutdownOptions so;
  so.drain_timeout = std::chrono::milliseconds(2000);  // ample for 30 tokens (0.24 s), too short for 500
  auto outcome = std::async(std::launch::async, [&] { return serve_until_shutdown(*server.http, *server.engine, signals.set, so); });

  auto short_stream = send(server.port(), request_body("short", 30, true));
  auto short_whole = send(server.port(), request_body("short", 30, false));
  auto long_stream = send(server.port(), request_body("long", 500, true));
  auto long_whole = send(server.port(), request_body("long", 500, false));
  ASSERT_TRUE(wait_until([&] { return server.engine->metrics().n_running.load() == 4; }));
  const auto signalled = Clock::now();
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);

  // At once: the probe fails and new work is refused with Retry-After.
  ASSERT_TRUE(wait_until([&] { return HttpClient(server.port()).request("GET", "/health").status == 503; },
                         std::chrono::milliseconds(500)));
  HttpResult refused = HttpClient(server.port()).request("POST", "/v1/completions", request_body("new", 2, false).dump());
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.headers["Retry-After"], "1");
  EXPECT_EQ(refused.headers["Connection"], "close");
  EXPECT_NE(refused.body.find("shutting down"), std::string::npos) << refused.body;

  // Short requests end as usual, inside the drain.
  HttpResult s = short_stream.get();
  std::vector<std::string> events = testing::sse_data(s.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(finish_reason(events), "length");
  EXPECT_TRUE(error_event(events).is_null()) << s.body;
  HttpResult w = short_whole.get();
  ASSERT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(w.json()["usage"]["completion_tokens"], 30);

  // Long ones are cut at the drain timeout: an OpenAI error event, then [DONE]; an error body.
  HttpResult l = long_stream.get();
  events = testing::sse_data(l.body);
  ASSERT_GE(events.size(), 2u) << l.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const json err = error_event(events);
  ASSERT_FALSE(err.is_null()) << l.body;
  EXPECT_EQ(err["error"]["type"], "server_error");
  EXPECT_NE(err["error"]["message"].get<std::string>().find("shutting down"), std::string::npos);
  EXPECT_EQ(finish_reason(events), "");
  HttpResult lw = long_whole.get();
  EXPECT_EQ(lw.status, 503) << lw.body;
  EXPECT_NE(lw.json()["error"]["message"].get<std::string>().find("shutting down"), std::string::npos);

  const ServeOutcome out = outcome.get();
  const double took = std::chrono::duration<double>(Clock::now() - signalled).count();
  EXPECT_EQ(out.end, ServeEnd::kDrained);
  EXPECT_EQ(out.signal, SIGTERM);
  EXPECT_EQ(out.exit_code(), 0);
  EXPECT_GE(took, 1.95);  // the drain waited for the long requests
  EXPECT_LT(took, 3.5);   // and then did not wait for them to finish (4 s at least)
}

TEST(Shutdown, SigintOnAnIdleServerExitsCleanlyAtOnce) {
  BlockedSignals signals;
  TestServer server;
  auto outcome = std::async(std::launch::async, [&] { return serve_until_shutdown(*server.http, *server.engine, signals.set); });
  EXPECT_EQ(HttpClient(server.port()).request("GET", "/health").status, 200);
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  const ServeOutcome out = outcome.get();
  EXPECT_EQ(out.end, ServeEnd::kDrained);
  EXPECT_EQ(out.exit_code(), 0);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);  // nothing to wait for
}

TEST(Shutdown, SecondSignalEndsTheDrainAtOnce) {
  BlockedSignals signals;
  TestServerOptions o;
  o.backend_delay_us = 4000;
  TestServer server(o);
  auto outcome = std::async(std::launch::async, [&] { return serve_until_shutdown(*server.http, *server.engine, signals.set); });
  auto stream = send(server.port(), request_body("long", 500, true));
  ASSERT_TRUE(wait_until([&] { return server.engine->metrics().n_running.load() == 1; }));
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(wait_until([&] { return HttpClient(server.port()).request("GET", "/health").status == 503; }));
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  ASSERT_EQ(outcome.wait_for(std::chrono::seconds(2)), std::future_status::ready) << "the drain (30 s) went on";
  const ServeOutcome out = outcome.get();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  EXPECT_EQ(out.end, ServeEnd::kSecondSignal);
  EXPECT_EQ(out.signal, SIGINT);
  EXPECT_EQ(out.exit_code(), 128 + SIGINT);
  server.engine->stop();  // `serve` would _Exit here; the test ends the stream itself
  const std::vector<std::string> events = testing::sse_data(stream.get().body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
}

// A device that dies mid-step: every request, running or waiting, ends with an error naming the
// failure (`expect` in its message); the probe and new requests get 503; the serve loop then ends
// with exit code 1. device_error: the backend throws the typed error of a sticky CUDA fault
// (core/device_error.h), as CUDA_CHECK does, rather than a plain Error.
void check_backend_failure(bool device_error, const std::string& expect) {
  BlockedSignals signals;
  TestServerOptions o;
  o.backend_delay_us = 2000;
  o.scheduler.max_num_seqs = 2;  // the third request waits
  TestServer server(o);
  auto stream_a = send(server.port(), request_body("a", 500, true));
  auto stream_b = send(server.port(), request_body("b", 500, true));
  ASSERT_TRUE(wait_until([&] { return server.engine->metrics().n_running.load() == 2; }));
  auto waiting = send(server.port(), request_body("c", 500, false));
  ASSERT_TRUE(wait_until([&] { return server.engine->metrics().n_waiting.load() == 1; }));
  const size_t before = server.backend.call_log().size();
  server.backend.fail_every_call(device_error);

  for (auto* f : {&stream_a, &stream_b}) {
    HttpResult r = f->get();
    std::vector<std::string> events = testing::sse_data(r.body);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "[DONE]");
    const json err = error_event(events);
    ASSERT_FALSE(err.is_null()) << r.body;
    EXPECT_EQ(err["error"]["type"], "server_error");
    EXPECT_NE(err["error"]["message"].get<std::string>().find(expect), std::string::npos) << err.dump();
    EXPECT_EQ(finish_reason(events), "");  // never a normal ending
  }
  HttpResult w = waiting.get();
  EXPECT_EQ(w.status, 500) << w.body;
  EXPECT_NE(w.json()["error"]["message"].get<std::string>().find(expect), std::string::npos) << w.body;
  EXPECT_TRUE(server.engine->failed());
  EXPECT_EQ(HttpClient(server.port()).request("GET", "/health").status, 503);
  HttpResult refused = HttpClient(server.port()).request("POST", "/v1/completions", request_body("new", 2, false).dump());
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.headers["Retry-After"], "1");
  EXPECT_LE(server.backend.call_log().size(), before + 1) << "the backend was called after it failed";

  const auto t0 = Clock::now();
  const ServeOutcome out = serve_until_shutdown(*server.http, *server.engine, signals.set);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
  EXPECT_EQ(out.end, ServeEnd::kEngineFailed);
  EXPECT_NE(out.failure.find(expect), std::string::npos) << out.failure;
  EXPECT_EQ(out.exit_code(), 1);
  const EngineMetrics& m = server.engine->metrics();
  EXPECT_EQ(m.n_running.load(), 0);
  EXPECT_EQ(m.n_waiting.load(), 0);
  EXPECT_EQ(m.kv_blocks_used.load(), 0);
  EXPECT_EQ(m.finished[static_cast<size_t>(FinishReason::kError)].load(), 3u);
}

TEST(Shutdown, BackendFailureEndsEveryRequestAndExitsNonZero) {
  check_backend_failure(false, "injected device failure");
}

// The CUDA backends' path (CUDA_CHECK throws DeviceError): the same ending, the error named.
TEST(Shutdown, StickyDeviceErrorEndsEveryRequestAndExitsOne) {
  check_backend_failure(true, "cudaErrorIllegalAddress");
}

}  // namespace
}  // namespace megadecode
