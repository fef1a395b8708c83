// Load: 256 concurrent streams with random client disconnects (every request ends cleanly, no KV
// block leaks, /health still 200), with the plain and the overlapped scheduler loop, and 1,000
// streaming connections held open at once.
// sanitize: thread
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"  // Asio's fences in TSan builds: known, harmless noise
#endif
#include <gtest/gtest.h>

#include "async_client.h"
#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;

void check_stream(const testing::StreamOutcome& o, bool want_usage, int index) {
  ASSERT_TRUE(o.error.empty()) << "stream " << index << ": " << o.error;
  ASSERT_TRUE(o.completed) << "stream " << index << " did not complete";
  ASSERT_EQ(o.status, 200);
  ASSERT_FALSE(o.events.empty());
  ASSERT_EQ(o.events.back(), "[DONE]") << "stream " << index;
  int finished = 0;
  for (size_t i = 0; i + 1 < o.events.size(); ++i) {
    json e = json::parse(o.events[i], nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << o.events[i];
    ASSERT_FALSE(e.contains("error")) << o.events[i];
    if (!e["choices"].empty() && !e["choices"][0]["finish_reason"].is_null()) ++finished;
  }
  EXPECT_EQ(finished, 1) << "stream " << index;
  if (want_usage) {
    json u = json::parse(o.events[o.events.size() - 2]);
    EXPECT_TRUE(u["choices"].empty());
    EXPECT_GT(u["usage"]["completion_tokens"].get<int>(), 0);
  }
}

void streams_with_random_disconnects(Overlap overlap) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  testing::TestServerOptions o;
  o.n_blocks = 96;  // 384 token slots for up to 16 sequences of ~100 tokens: preemption happens
  o.block_size = 4;
  o.scheduler.max_num_seqs = 16;
  o.scheduler.max_prefill_tokens = 24;
  o.scheduler.overlap = overlap;
  o.backend_delay_us = 100;
  testing::TestServer server(o);
  constexpr int kStreams = 256;
  std::vector<testing::StreamPlan> plans;
  std::vector<bool> usage;
  for (int i = 0; i < kStreams; ++i) {
    const bool chat = rng.below(2) == 0;
    json body = {{"max_tokens", 5 + rng.below(56)}, {"stream", true}, {"temperature", rng.below(2) ? 0.0 : 0.9},
                 {"ignore_eos", rng.below(2) == 0}};
    const std::string prompt = (rng.below(2) ? "A shared prefix for caching. " : "") + std::to_string(rng.next());
    if (chat) body["messages"] = {{{"role", "user"}, {"content", prompt}}};
    else body["prompt"] = prompt;
    usage.push_back(rng.below(2) == 0);
    if (usage.back()) body["stream_options"] = {{"include_usage", true}};
    testing::StreamPlan p;
    p.path = chat ? "/v1/chat/completions" : "/v1/completions";
    p.body = body.dump();
    const uint64_t d = rng.below(10);
    p.disconnect_after = d < 2 ? 0 : d < 4 ? 1 + static_cast<int>(rng.below(8)) : -1;
    plans.push_back(std::move(p));
  }
  auto outcomes = testing::run_streams(server.port(), plans);
  int n_complete = 0, n_cut = 0;
  for (int i = 0; i < kStreams; ++i) {
    if (plans[i].disconnect_after >= 0 && outcomes[i].disconnected) {
      ++n_cut;
      EXPECT_TRUE(outcomes[i].error.empty()) << outcomes[i].error;
      continue;
    }
    check_stream(outcomes[i], usage[i], i);
    ++n_complete;
  }
  std::printf("%d completed, %d disconnected, %llu preemptions\n", n_complete, n_cut,
              static_cast<unsigned long long>(server.engine->metrics().preemptions.load()));
  EXPECT_TRUE(server.drained()) << "KV blocks still held after every client left";
  EngineMetrics& m = server.engine->metrics();
  uint64_t ended = 0;
  for (auto& f : m.finished) ended += f.load();
  EXPECT_EQ(ended, static_cast<uint64_t>(kStreams));  // every sequence ended exactly once
  EXPECT_EQ(HttpClient(server.port()).request("GET", "/health").status, 200);
  EXPECT_GT(n_cut, 0);
  EXPECT_GT(n_complete, kStreams / 2);
  uint64_t n_chained = 0;
  ASSERT_TRUE(server.engine->inspect([&](const Scheduler& s) { n_chained = s.n_chained(); }));
  std::printf("%llu steps chained\n", static_cast<unsigned long long>(n_chained));
  if (overlap != Overlap::kOff) {
    EXPECT_GT(n_chained, 0u);
  }
}

TEST(ServerLoad, ConcurrentStreamsWithRandomDisconnects) { streams_with_random_disconnects(Overlap::kOff); }

// Disconnects land while the next step of the sequence is already launched: its token is dropped.
TEST(ServerLoad, ConcurrentStreamsWithRandomDisconnectsOverlapped) { streams_with_random_disconnects(Overlap::kAlways); }

TEST(ServerLoad, HoldsAThousandStreamingConnections) {
  const long limit = raise_open_file_limit();
  ASSERT_GE(limit, 2200) << "the open-file limit is too low for 1,000 client + 1,000 server sockets";
  testing::TestServerOptions o;
  o.n_blocks = 2048;
  o.scheduler.max_num_seqs = 64;
  o.scheduler.check_invariants = false;
  o.max_waiting = 2000;
  testing::TestServer server(o);
  constexpr int kConnections = 1000;
  std::vector<testing::StreamPlan> plans(kConnections);
  for (int i = 0; i < kConnections; ++i)
    plans[i].body = json{{"prompt", "conn " + std::to_string(i)}, {"max_tokens", 4}, {"ignore_eos", true},
                         {"stream", true}}.dump();
  // Nothing completes until every connection is up: then all 1,000 streams are open at once.
  server.backend.close_gate();
  std::vector<testing::StreamOutcome> outcomes;
  std::thread clients([&] { outcomes = testing::run_streams(server.port(), plans); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t peak = 0;
  while (peak < kConnections && std::chrono::steady_clock::now() < deadline) {
    peak = std::max(peak, server.http->n_connections());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  server.backend.open_gate();
  clients.join();
  for (int i = 0; i < kConnections; ++i) check_stream(outcomes[i], false, i);
  std::printf("peak %zu open connections\n", peak);
  EXPECT_EQ(peak, static_cast<size_t>(kConnections));
  EXPECT_TRUE(server.drained());
}

}  // namespace
}  // namespace megadecode
