// sanitize: address
// The decode-stall mode of `megadecode bench serve`: the window arithmetic on fixed and random
// arrival times, and the whole run against the test server (a slow fake backend that prefills a
// long prompt in chunks, so streams slow down while it prefills), including its failure modes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../server/server_fixture.h"
#include "bench_serve_run.h"
#include "bench/bench.h"
#include "bench/serve_stall.h"
#include "core/check.h"
#include "core/rng.h"

namespace megadecode {
namespace {

using namespace serve_bench;
using nlohmann::json;

TEST(StallWindows, FixedTimes) {
  // Stream 0 stalls from 3 to 10 across the long prompt's window (3.5, 10.5); stream 1 does not.
  const std::vector<std::vector<double>> t = {{0, 1, 2, 3, 10, 11, 12}, {0.5, 1.5, 2.5, 3.25, 4, 6, 9, 11}};
  StallReport r;
  stall_windows(t, 1.0, 3.5, 10.5, r);
  // before: (1,2) (2,3) of stream 0; (1.5,2.5) (2.5,3.25) of stream 1.
  EXPECT_EQ(r.before.itl.count, 4u);
  EXPECT_DOUBLE_EQ(r.before.itl.max, 1.0);
  EXPECT_DOUBLE_EQ(r.before.itl.mean, (1 + 1 + 1 + 0.75) / 4);
  // during: (3,10) (10,11) of stream 0; (3.25,4) (4,6) (6,9) (9,11) of stream 1.
  EXPECT_EQ(r.during.itl.count, 6u);
  EXPECT_DOUBLE_EQ(r.during.itl.max, 7.0);
  EXPECT_DOUBLE_EQ(r.during.itl.mean, (7 + 1 + 0.75 + 2 + 3 + 2) / 6.0);
  EXPECT_DOUBLE_EQ(r.before.start, 1.0);
  EXPECT_DOUBLE_EQ(r.before.end, 3.5);
  EXPECT_DOUBLE_EQ(r.during.start, 3.5);
  EXPECT_DOUBLE_EQ(r.during.end, 10.5);
  EXPECT_THROW(stall_windows(t, 4.0, 3.5, 10.5, r), Error);
  EXPECT_THROW(stall_windows(t, 1.0, 11.0, 10.5, r), Error);
}

TEST(StallWindows, RandomTimesCoverTheWindows) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    // One stream: random gaps (some long), windows at random points inside it.
    const int n = 3 + static_cast<int>(rng.below(60));
    std::vector<double> t = {rng.unit()};
    for (int k = 1; k < n; ++k) t.push_back(t.back() + (rng.below(8) == 0 ? 5.0 : 0.01) * (0.1 + rng.unit()));
    double a = t.front() + rng.unit() * (t.back() - t.front());
    double b = t.front() + rng.unit() * (t.back() - t.front());
    double c = t.front() + rng.unit() * (t.back() - t.front());
    if (a > b) std::swap(a, b);
    if (b > c) std::swap(b, c);
    if (a > b) std::swap(a, b);
    StallReport r;
    stall_windows({t}, a, b, c, r);
    // Reference: every gap classified by brute force over its endpoints.
    size_t n_before = 0, n_during = 0;
    double sum_during = 0, max_during = 0;
    for (int k = 1; k < n; ++k) {
      if (t[k - 1] >= a && t[k] <= b) ++n_before;
      if (t[k] > b && t[k - 1] < c) {
        ++n_during;
        sum_during += t[k] - t[k - 1];
        max_during = std::max(max_during, t[k] - t[k - 1]);
      }
    }
    ASSERT_EQ(r.before.itl.count, n_before);
    ASSERT_EQ(r.during.itl.count, n_during);
    ASSERT_DOUBLE_EQ(r.during.itl.max, max_during);
    // The during samples of a stream that spans the window cover it: no stall can hide.
    if (c > b) {
      ASSERT_GE(sum_during, (c - b) * (1 - 1e-12));
    }
    ASSERT_LE(r.during.itl.median, r.during.itl.p99);
    ASSERT_LE(r.during.itl.p99, r.during.itl.max);
  }
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
}

// bench serve --background-streams against the test server; returns the exit code and the JSON.
std::pair<int, json> run_bench(int port, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--vocab", "250"});
  return testing::run_bench_serve(port, extra);
}

testing::TestServerOptions slow_server() {
  testing::TestServerOptions o;
  o.n_blocks = 1024;
  o.max_positions = 2048;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_prefill_tokens = 32;  // the long prompt prefills in 16 chunks
  o.backend_delay_us = 3000;            // every prefill and decode call
  return o;
}

TEST(BenchServeStall, WindowsAreConsistentAndShowTheStall) {
  testing::TestServer server(slow_server());
  const int streams = 5, before_tokens = 16, long_len = 512;
  // A stall the measurement must see, whatever the machine's load: once the long request is in
  // the scheduler (streams + 1 sequences), every backend call waits kStall. No token of any
  // request comes out meanwhile, so some stream gap in the window lasts at least kStall.
  constexpr auto kStall = std::chrono::milliseconds(250);
  std::atomic<bool> quit{false}, stalled{false};
  std::thread staller([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!quit && std::chrono::steady_clock::now() < deadline) {
      int n = 0;
      server.engine->inspect([&](const Scheduler& sched) { n = sched.n_running() + sched.n_waiting(); });
      if (n == streams + 1) {
        server.backend.close_gate();
        std::this_thread::sleep_for(kStall);
        server.backend.open_gate();
        stalled = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  auto [rc, j] = run_bench(server.port(), {"--background-streams", std::to_string(streams), "--input-len", "7",
                                           "--output-len", "1000", "--long-prompt-len", std::to_string(long_len),
                                           "--before-tokens", std::to_string(before_tokens), "--timeout", "60"});
  quit = true;
  staller.join();
  ASSERT_TRUE(stalled);
  ASSERT_EQ(rc, 0) << j.dump(2);
  ASSERT_TRUE(j["complete"].get<bool>()) << j.dump(2);
  EXPECT_EQ(j["mode"], "decode_stall");
  EXPECT_EQ(j["background_streams"], streams);
  EXPECT_EQ(j["long_prompt_len"], long_len);
  const double ready = j["t_ready_s"], arrival = j["t_long_arrival_s"], first = j["t_long_first_token_s"];
  EXPECT_LT(0.0, ready);
  EXPECT_LT(ready, arrival);
  EXPECT_LT(arrival, first);
  EXPECT_NEAR(j["long_ttft_ms"].get<double>(), (first - arrival) * 1e3, 1e-6);
  const json& before = j["before"];
  const json& during = j["during"];
  EXPECT_DOUBLE_EQ(before["start_s"].get<double>(), ready);
  EXPECT_DOUBLE_EQ(before["end_s"].get<double>(), arrival);
  EXPECT_DOUBLE_EQ(during["start_s"].get<double>(), arrival);
  EXPECT_DOUBLE_EQ(during["end_s"].get<double>(), first);
  // Every stream gave at least before_tokens - 1 gaps before, and one gap or more overlaps the window.
  EXPECT_GE(before["samples"].get<int>(), streams * (before_tokens - 1));
  EXPECT_GE(during["samples"].get<int>(), streams);
  for (const json* w : {&before, &during}) {
    const json& itl = (*w)["itl_ms"];
    EXPECT_GT(itl["p50"].get<double>(), 0.0);
    EXPECT_LE(itl["p50"].get<double>(), itl["p99"].get<double>());
    EXPECT_LE(itl["p99"].get<double>(), itl["max"].get<double>());
  }
  const double stall_ms = std::chrono::duration<double, std::milli>(kStall).count();
  // The window holds the stall and 16 chunks of the long prompt, each a 3 ms backend call.
  EXPECT_GE(during["window_ms"].get<double>(), stall_ms + 16 * 3.0);
  EXPECT_GE(during["itl_ms"]["max"].get<double>(), stall_ms);
  EXPECT_GE(during["itl_ms"]["max"].get<double>(), before["itl_ms"]["p99"].get<double>());
  EXPECT_GE(j["itl_max_ratio"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["itl_p99_during_over_p50_before"].get<double>(),
                   during["itl_ms"]["p99"].get<double>() / before["itl_ms"]["p50"].get<double>());
  EXPECT_GT(j["itl_p99_during_over_p50_before"].get<double>(), 1.0) << "the stall is in the window";
  for (const json& n : j["stream_tokens"]) EXPECT_GT(n.get<int>(), before_tokens);
  EXPECT_TRUE(server.drained());  // the streams were cancelled; the server freed their blocks
}

TEST(BenchServeStall, StreamsThatEndEarlyMakeItFail) {
  testing::TestServer server(slow_server());
  auto [rc, j] = run_bench(server.port(), {"--background-streams", "3", "--input-len", "5", "--output-len", "6",
                                           "--long-prompt-len", "64", "--before-tokens", "8", "--timeout", "60"});
  EXPECT_EQ(rc, 1);
  EXPECT_FALSE(j["complete"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("raise --output-len"), std::string::npos) << j["error"];
  EXPECT_FALSE(j.contains("during"));
  EXPECT_TRUE(server.drained());
}

TEST(BenchServeStall, ALongPromptTheServerRejectsMakesItFail) {
  testing::TestServer server(slow_server());
  auto [rc, j] = run_bench(server.port(), {"--background-streams", "2", "--input-len", "5", "--output-len", "500",
                                           "--long-prompt-len", "3000", "--before-tokens", "3", "--timeout", "60"});
  EXPECT_EQ(rc, 1);
  EXPECT_FALSE(j["complete"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("the long request ended without a token: HTTP status 400 (is "
                                               "--long-prompt-len + 4 within the server's max_model_len?)"),
            std::string::npos)
      << j["error"];
  EXPECT_TRUE(server.drained());
}

TEST(BenchServeStall, TimesOutWhenNothingDecodes) {
  testing::TestServer server(slow_server());
  server.backend.close_gate();  // every backend call waits: no stream ever gets a token
  auto [rc, j] = run_bench(server.port(), {"--background-streams", "2", "--input-len", "5", "--output-len", "50",
                                           "--long-prompt-len", "64", "--timeout", "0.5"});
  server.backend.open_gate();
  EXPECT_EQ(rc, 1);
  EXPECT_FALSE(j["complete"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("timed out after 0.5 s waiting for every stream's first token"),
            std::string::npos)
      << j["error"];
  EXPECT_TRUE(server.drained());
}

TEST(BenchServeStall, BadFlags) {
  testing::TestServer server;
  auto bad = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--url", "http://127.0.0.1:" + std::to_string(server.port())};
    a.insert(a.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    EXPECT_THROW(bench_serve(static_cast<int>(argv.size()), argv.data()), Error) << extra[0];
  };
  bad({"--background-streams", "0"});
  bad({"--background-streams", "2", "--before-tokens", "1"});
  bad({"--background-streams", "2", "--timeout", "-1"});
  bad({"--long-prompt-len", "100"});  // without --background-streams
  bad({"--num-prompts", "0"});
  bad({"--timeout", "-3"});
}

}  // namespace
}  // namespace megadecode
