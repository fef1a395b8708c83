// `megadecode bench serve` against a test server: every request completes, the JSON report holds
// the counts and latency summaries, and the server ends with no KV block held; against a server
// without a tokenizer (--skip-tokenizer-init) too, whose chunks carry token ids and no text.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "../server/server_fixture.h"
#include "bench/bench.h"
#include "bench/serve_client.h"
#include "core/check.h"

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

testing::TestServerOptions without_tokenizer() {
  testing::TestServerOptions o;
  o.skip_tokenizer = true;
  return o;
}

// One streaming request of `output_len` tokens, as bench serve sends it, run to its end.
serve_bench::RequestRecord run_one(int port, int output_len) {
  namespace net = serve_bench::net;
  net::io_context ioc;
  const serve_bench::tcp::endpoint ep(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port));
  const serve_bench::Target target{"127.0.0.1", port};
  const std::string body = serve_bench::completion_body("fake-model", {72, 101, 108, 108, 111}, output_len);
  serve_bench::RequestRecord rec;
  int n_chunks = 0;
  auto req = std::make_shared<serve_bench::BenchRequest>(
      ioc, ep, serve_bench::http_post(target, "/v1/completions", body), rec, serve_bench::BenchClock::now(),
      [&](double) { ++n_chunks; }, nullptr);
  req->start();
  ioc.run_for(std::chrono::seconds(30));
  EXPECT_TRUE(req->finished());
  EXPECT_EQ(n_chunks, static_cast<int>(rec.chunk_times.size()));
  return rec;
}

TEST(BenchServe, CountsEveryTokenOfATokenIdServer) {
  for (bool skip_tokenizer : {false, true}) {
    SCOPED_TRACE(skip_tokenizer ? "token ids" : "text");
    testing::TestServer server(skip_tokenizer ? without_tokenizer() : testing::TestServerOptions{});
    const serve_bench::RequestRecord rec = run_one(server.port(), 9);
    EXPECT_TRUE(rec.ok) << rec.error;
    EXPECT_EQ(rec.output_tokens, 9);
    EXPECT_GE(rec.first_token, rec.send);
    EXPECT_GE(rec.end, rec.first_token);
    if (skip_tokenizer) {
      EXPECT_EQ(rec.chunk_times.size(), 9u);  // every token is a chunk of its id
    } else {
      EXPECT_GE(rec.chunk_times.size(), 1u);  // text chunks: tokens that complete a character
    }
    EXPECT_TRUE(std::is_sorted(rec.chunk_times.begin(), rec.chunk_times.end()));
    EXPECT_TRUE(server.drained());
  }
}

TEST(BenchServe, MeasuresATokenIdServer) {
  testing::TestServer server(without_tokenizer());
  const auto json_path =
      std::filesystem::temp_directory_path() / ("bench_serve_ids_" + std::to_string(::getpid()) + ".json");
  std::vector<std::string> a = {"--url", "http://127.0.0.1:" + std::to_string(server.port()), "--num-prompts", "12",
                                "--concurrency", "4", "--input-len", "10", "--output-len", "8", "--vocab", "250",
                                "--json", json_path.string()};
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  EXPECT_EQ(bench_serve(static_cast<int>(argv.size()), argv.data()), 0);
  std::ifstream in(json_path);
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_output_tokens"], 12 * 8);
  EXPECT_GT(j["ttft"]["mean_ms"].get<double>(), 0.0);
  EXPECT_GT(j["itl"]["mean_ms"].get<double>(), 0.0);
  EXPECT_GE(j["itl"]["max_ms"].get<double>(), j["itl"]["p99_ms"].get<double>());
  std::filesystem::remove(json_path);
  EXPECT_TRUE(server.drained());
}

// --response-format: every request carries it (a server without a tokenizer refuses each one with
// a 400, so every request fails); with a tokenizer every request completes; a schema file that
// cannot be read or holds no schema is an error before anything is sent.
TEST(BenchServe, ResponseFormatConstrainsEveryRequest) {
  EXPECT_NE(serve_bench::completion_body("m", {1, 2}, 4, {{"type", "json_object"}}).find("\"response_format\":{\"type\":\"json_object\"}"),
            std::string::npos);
  EXPECT_EQ(serve_bench::completion_body("m", {1, 2}, 4).find("response_format"), std::string::npos);
  const auto dir = std::filesystem::temp_directory_path();
  const auto json_path = dir / ("bench_serve_rf_" + std::to_string(::getpid()) + ".json");
  const auto schema_path = dir / ("bench_serve_schema_" + std::to_string(::getpid()) + ".json");
  std::ofstream(schema_path) << R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})";
  auto run = [&](int port, const std::string& format) {
    std::vector<std::string> a = {"--url", "http://127.0.0.1:" + std::to_string(port), "--num-prompts", "6",
                                  "--concurrency", "3", "--input-len", "5", "--output-len", "24", "--vocab", "120",
                                  "--response-format", format, "--json", json_path.string()};
    std::vector<char*> argv;
    for (auto& x : a) argv.push_back(x.data());
    const int rc = bench_serve(static_cast<int>(argv.size()), argv.data());
    std::ifstream in(json_path);
    return std::pair{rc, nlohmann::json::parse(in)};
  };
  {
    testing::TestServer server;
    for (const std::string& format : {std::string("json_object"), schema_path.string()}) {
      auto [rc, j] = run(server.port(), format);
      EXPECT_EQ(rc, 0) << format;
      EXPECT_EQ(j["completed"], 6) << format;
      EXPECT_LE(j["total_output_tokens"].get<int>(), 6 * 24);
    }
    EXPECT_TRUE(server.drained());
  }
  {
    testing::TestServer server(without_tokenizer());
    auto [rc, j] = run(server.port(), "json_object");
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(j["failed"], 6);
    EXPECT_EQ(j["completed"], 0);
    std::ofstream(schema_path) << "[1, 2]";
    EXPECT_THROW(run(server.port(), schema_path.string()), Error);
    EXPECT_THROW(run(server.port(), (dir / "no-such-schema.json").string()), Error);
  }
  std::filesystem::remove(json_path);
  std::filesystem::remove(schema_path);
}

// --output-lens: an unconstrained run asks each request for the length the constrained run's same
// request produced (its JSON's output_tokens_each), so the two do the same work; a file of the
// wrong count or with a failed request's -1 is an error before anything is sent, and
// --output-len beside it is refused.
TEST(BenchServe, OutputLensReplayAConstrainedRunsLengths) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto first = dir / ("bench_serve_lens_" + std::to_string(::getpid()) + ".json");
  const auto bad = dir / ("bench_serve_lens_bad_" + std::to_string(::getpid()) + ".json");
  testing::TestServer server;
  auto run = [&](std::vector<std::string> extra, const std::filesystem::path& out) {
    std::vector<std::string> a = {"--url", "http://127.0.0.1:" + std::to_string(server.port()), "--num-prompts", "7",
                                  "--concurrency", "3", "--input-len", "5", "--vocab", "120", "--seed", "11",
                                  "--json", out.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& x : a) argv.push_back(x.data());
    const int rc = bench_serve(static_cast<int>(argv.size()), argv.data());
    std::ifstream in(out);
    return std::pair{rc, nlohmann::json::parse(in)};
  };
  auto [rc1, constrained] = run({"--output-len", "40", "--response-format", "json_object"}, first);
  ASSERT_EQ(rc1, 0);
  const std::vector<int> lens = constrained["output_tokens_each"].get<std::vector<int>>();
  ASSERT_EQ(lens.size(), 7u);
  int total = 0;
  for (int n : lens) {
    EXPECT_GE(n, 1);
    EXPECT_LE(n, 40);
    total += n;
  }
  EXPECT_EQ(constrained["total_output_tokens"], total);
  const auto second = dir / ("bench_serve_lens_2_" + std::to_string(::getpid()) + ".json");
  auto [rc2, free_run] = run({"--output-lens", first.string()}, second);
  ASSERT_EQ(rc2, 0);
  EXPECT_EQ(free_run["output_tokens_each"].get<std::vector<int>>(), lens);  // ignore_eos: exactly the lengths asked
  EXPECT_EQ(free_run["output_len"], -1);
  EXPECT_EQ(free_run["output_lens_from"], first.string());
  std::ofstream(bad) << "[3, 4]";
  EXPECT_THROW(run({"--output-lens", bad.string()}, second), Error);
  std::ofstream(bad) << R"({"output_tokens_each": [3, 4, 5, 6, -1, 2, 2]})";
  EXPECT_THROW(run({"--output-lens", bad.string()}, second), Error);
  EXPECT_THROW(run({"--output-lens", first.string(), "--output-len", "9"}, second), Error);
  for (const auto& p : {first, second, bad}) std::filesystem::remove(p);
  EXPECT_TRUE(server.drained());
}

TEST(BenchServe, ChunksCarryTokensWhenTheyHoldTextOrIds) {
  using nlohmann::json;
  EXPECT_TRUE(serve_bench::carries_tokens(json::parse(R"({"choices": [{"text": "a"}]})")));
  EXPECT_TRUE(serve_bench::carries_tokens(json::parse(R"({"choices": [{"text": "", "token_ids": [5]}]})")));
  EXPECT_TRUE(serve_bench::carries_tokens(json::parse(R"({"choices": [{"delta": {"content": "x"}}]})")));
  EXPECT_TRUE(
      serve_bench::carries_tokens(json::parse(R"({"choices": [{"text": ""}, {"text": "", "token_ids": [1, 2]}]})")));
  EXPECT_FALSE(serve_bench::carries_tokens(json::parse(R"({"choices": [{"text": "", "token_ids": []}]})")));
  EXPECT_FALSE(serve_bench::carries_tokens(json::parse(R"({"choices": [{"text": "", "finish_reason": "length"}]})")));
  EXPECT_FALSE(
      serve_bench::carries_tokens(json::parse(R"({"choices": [{"delta": {"role": "assistant", "content": ""}}]})")));
  EXPECT_FALSE(serve_bench::carries_tokens(json::parse(R"({"choices": [], "usage": {"completion_tokens": 3}})")));
  EXPECT_FALSE(serve_bench::carries_tokens(json::parse(R"({"choices": [{"token_ids": "5"}, 7]})")));
  EXPECT_FALSE(serve_bench::carries_tokens(json::parse(R"({"choices": {"text": "a"}})")));
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
