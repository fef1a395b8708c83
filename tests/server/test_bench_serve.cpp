// `megadecode bench serve` against a test server: every request completes, the JSON report holds
// the counts and latency summaries, and the server ends with no KV block held.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/bench.h"
#include "server_fixture.h"

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
  }
  std::filesystem::remove(json_path);
  EXPECT_TRUE(server.drained());
}

}  // namespace
}  // namespace megadecode
