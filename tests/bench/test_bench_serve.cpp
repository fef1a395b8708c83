// `megadecode bench serve` against a test server: every request completes, the JSON report holds
// the counts and latency summaries, and the server ends with no KV block held.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "../server/server_fixture.h"
#include "bench/bench.h"

namespace megadecode {
namespace {

TEST(BenchServe, CompletesEveryRequestAndWritesJson) {
  testing::TestServer server;
  const auto json_path = std::filesystem::temp_directory_path() / ("bench_serve_" + std::to_string(::getpid()) + ".json");
  for (const char* endpoint : {"completions", "chat"}) {
    std::vector<std::string> a = {"--url", "http://127.0.0.1:" + std::to_string(server.port()), "--num-prompts", "24",
                                  "--concurrency", "6", "--input-len", "12", "--output-len", "9", "--vocab", "250",
                                  "--endpoint", endpoint, "--request-rate", "400", "--json", json_path.string()};
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    EXPECT_EQ(bench_serve(static_cast<int>(argv.size()), argv.data()), 0);
    std::ifstream in(json_path);
    nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["model"], "fake-model");
    EXPECT_EQ(j["completed"], 24);
    EXPECT_EQ(j["failed"], 0);
    EXPECT_EQ(j["total_output_tokens"], 24 * 9);
    EXPECT_GT(j["ttft"]["mean_ms"].get<double>(), 0.0);
    EXPECT_GE(j["e2el"]["p99_ms"].get<double>(), j["e2el"]["median_ms"].get<double>());
    EXPECT_GE(j["e2el"]["max_ms"].get<double>(), j["e2el"]["p99_ms"].get<double>());
    // Each request's decode rate is 1 / its TPOT, so their mean is at least 1 / mean TPOT (Jensen).
    EXPECT_GE(j["decode_tok_s_per_request"]["mean"].get<double>() * 1.0001, 1e3 / j["tpot"]["mean_ms"].get<double>());
  }
  std::filesystem::remove(json_path);
  EXPECT_TRUE(server.drained());
}

// --timeout bounds the run: with a backend that never answers, every request fails (cancelled or
// never sent), the JSON is still written, and the server frees what the cancelled requests held.
TEST(BenchServe, TimeoutCancelsWhatIsInFlight) {
  testing::TestServer server;
  server.backend.close_gate();
  const auto json_path = std::filesystem::temp_directory_path() / ("bench_serve_to_" + std::to_string(::getpid()) + ".json");
  std::vector<std::string> a = {"--url", "http://127.0.0.1:" + std::to_string(server.port()), "--num-prompts", "5",
                                "--concurrency", "2", "--input-len", "6", "--output-len", "4", "--vocab", "250",
                                "--timeout", "0.4", "--json", json_path.string()};
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(bench_serve(static_cast<int>(argv.size()), argv.data()), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  server.backend.open_gate();
  std::ifstream in(json_path);
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["completed"], 0);
  EXPECT_EQ(j["failed"], 5);
  EXPECT_EQ(j["total_output_tokens"], 0);
  std::filesystem::remove(json_path);
  EXPECT_TRUE(server.drained());
}

}  // namespace
}  // namespace megadecode
