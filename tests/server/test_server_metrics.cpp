// /metrics tells the truth (server/metrics_text.cpp): while requests run, the gauges count them
// and their KV blocks; after an abort storm (clients that disconnect, streaming or not, running
// or still waiting) every gauge is back at zero without a new request to refresh it.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "core/rng.h"
#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::TestServer;
using testing::TestServerOptions;
using testing::wait_until;

// The value of the sample `megadecode:NAME{...}` in a Prometheus text, NaN when absent.
double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  const std::string prefix = "megadecode:" + name + "{";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  return std::nan("");
}

TEST(ServerMetrics, GaugesReturnToZeroAfterAnAbortStorm) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  TestServerOptions o;
  o.backend_delay_us = 4000;  // a request of 500 tokens runs 2 s at least: none ends by itself
  o.scheduler.max_num_seqs = 4;
  TestServer server(o);
  HttpClient scraper(server.port());
  const int n = 6 + static_cast<int>(rng.below(10));
  std::vector<std::unique_ptr<HttpClient>> clients;
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<HttpClient>(server.port()));
    const json body = {{"prompt", "storm " + std::to_string(i)}, {"max_tokens", 500}, {"ignore_eos", true},
                       {"stream", rng.below(2) == 0}};
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.dump().size()) + "\r\n\r\n" + body.dump();
    boost::asio::write(clients.back()->socket(), boost::asio::buffer(req));
  }
  ASSERT_TRUE(wait_until(
      [&] {
        const std::string m = scraper.request("GET", "/metrics").body;
        return metric(m, "num_requests_running") == 4 && metric(m, "num_requests_waiting") == n - 4;
      },
      std::chrono::milliseconds(5000)));
  const std::string busy = scraper.request("GET", "/metrics").body;
  EXPECT_GT(metric(busy, "kv_cache_blocks_used"), 0) << busy;
  EXPECT_EQ(metric(busy, "kv_cache_blocks_total"), 256);
  EXPECT_NEAR(metric(busy, "kv_cache_usage_perc"), metric(busy, "kv_cache_blocks_used") / 256.0, 1e-12);

  // Disconnect everyone, in random order, some at once and some a little later.
  while (!clients.empty()) {
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(rng.below(clients.size())));
    if (rng.below(3) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(rng.below(5)));
  }
  std::string last;
  const bool zero = wait_until(
      [&] {
        last = scraper.request("GET", "/metrics").body;
        for (const char* g : {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_cache_blocks_used"})
          if (metric(last, g) != 0) return false;
        return true;
      },
      std::chrono::milliseconds(3000));
  EXPECT_TRUE(zero) << "gauges after the storm:\n" << last.substr(0, 1200);
  EXPECT_EQ(server.engine->metrics().finished[static_cast<size_t>(FinishReason::kAbort)].load(), static_cast<uint64_t>(n));
  EXPECT_TRUE(server.drained());
}

}  // namespace
}  // namespace megadecode
