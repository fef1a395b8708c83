// sanitize: address
// Scenario g of `megadecode bench serve --agent N` (serve_agent.h) against the test server: every
// turn of every conversation runs, each prompt is the last one plus the returned output and the new
// tokens, the returned token ids join the history (so the next turn hits the prefix cache over the
// whole previous prompt), the hit rate is the usage's cached tokens over its prompt tokens, and
// nothing is cached with the prefix cache off; a server that sends text gets random stand-ins.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "../server/server_fixture.h"
#include "bench_serve_run.h"
#include "bench/bench.h"
#include "core/check.h"

namespace megadecode {
namespace {

using nlohmann::json;

constexpr int kConversations = 3, kTurns = 3, kPrefix = 40, kAppendMin = 5, kAppendMax = 12, kOutput = 6;

std::pair<int, json> run_agent_bench(int port, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--vocab", "250", "--agent", std::to_string(kConversations), "--turns",
                                std::to_string(kTurns), "--prefix-len", std::to_string(kPrefix), "--append-min",
                                std::to_string(kAppendMin), "--append-max", std::to_string(kAppendMax), "--output-len",
                                std::to_string(kOutput), "--timeout", "60", "--seed", std::to_string(test_seed() % 100000)};
  a.insert(a.end(), extra.begin(), extra.end());
  return testing::run_bench_serve(port, a);
}

testing::TestServerOptions ids_server(bool prefix_caching) {
  testing::TestServerOptions o;
  o.skip_tokenizer = true;
  o.scheduler.prefix_caching = prefix_caching;
  return o;
}

// The turns by conversation, in turn order; checks the prompts grow as the history says.
std::map<int, std::vector<json>> by_conversation(const json& j) {
  std::map<int, std::vector<json>> turns;
  for (const json& t : j["turn_records"]) turns[t["conversation"].get<int>()].push_back(t);
  EXPECT_EQ(turns.size(), static_cast<size_t>(kConversations));
  for (auto& [c, ts] : turns) {
    std::sort(ts.begin(), ts.end(), [](const json& a, const json& b) { return a["turn"] < b["turn"]; });
    EXPECT_EQ(ts.size(), static_cast<size_t>(kTurns)) << c;
    for (size_t t = 0; t < ts.size(); ++t) {
      EXPECT_EQ(ts[t]["turn"], static_cast<int>(t));
      EXPECT_TRUE(ts[t]["ok"].get<bool>());
      EXPECT_EQ(ts[t]["output_tokens"], kOutput);
      const int prompt = ts[t]["prompt_tokens"];
      const int before = t == 0 ? kPrefix : ts[t - 1]["prompt_tokens"].get<int>() + kOutput;
      EXPECT_GE(prompt, before + kAppendMin) << "conversation " << c << " turn " << t;
      EXPECT_LE(prompt, before + kAppendMax) << "conversation " << c << " turn " << t;
    }
  }
  return turns;
}

TEST(BenchServeAgent, TurnsResendTheirHistoryAndHitThePrefixCache) {
  testing::TestServer server(ids_server(true));
  auto [rc, j] = run_agent_bench(server.port());
  ASSERT_EQ(rc, 0) << j.dump(2);
  EXPECT_EQ(j["mode"], "agent");
  EXPECT_TRUE(j["complete"].get<bool>());
  ASSERT_EQ(j["turn_records"].size(), static_cast<size_t>(kConversations * kTurns));
  long long prompt = 0, cached = 0;
  for (const auto& [c, ts] : by_conversation(j)) {
    for (size_t t = 0; t < ts.size(); ++t) {
      EXPECT_TRUE(ts[t]["ids_returned"].get<bool>());
      prompt += ts[t]["prompt_tokens"].get<int>();
      cached += ts[t]["cached_tokens"].get<int>();
      if (t == 0) continue;
      // The previous prompt and its output, in full blocks of 4, are in the cache (the last block
      // of a prompt is never a hit).
      const int held = ts[t - 1]["prompt_tokens"].get<int>() + kOutput;
      EXPECT_GE(ts[t]["cached_tokens"].get<int>(), held / 4 * 4 - 4) << "conversation " << c << " turn " << t;
    }
  }
  EXPECT_EQ(j["prompt_tokens"], prompt);
  EXPECT_EQ(j["cached_tokens"], cached);
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_rate"].get<double>(), static_cast<double>(cached) / prompt);
  EXPECT_GT(j["prefix_cache_hit_rate"].get<double>(), 0.4);
  EXPECT_EQ(j["output_tokens"], kConversations * kTurns * kOutput);
  EXPECT_GT(j["ttft_ms"]["p50"].get<double>(), 0.0);
  EXPECT_LE(j["ttft_ms"]["p50"].get<double>(), j["ttft_ms"]["p99"].get<double>());
  EXPECT_GT(j["ttft_later_turns_ms"]["p50"].get<double>(), 0.0);
  EXPECT_TRUE(server.drained());
}

TEST(BenchServeAgent, NothingIsCachedWithThePrefixCacheOff) {
  testing::TestServer server(ids_server(false));
  auto [rc, j] = run_agent_bench(server.port());
  ASSERT_EQ(rc, 0) << j.dump(2);
  by_conversation(j);
  for (const json& t : j["turn_records"]) EXPECT_EQ(t["cached_tokens"], 0);
  EXPECT_EQ(j["prefix_cache_hit_rate"].get<double>(), 0.0);
}

TEST(BenchServeAgent, TextServersGetStandInsAndBadFlagsAreRefused) {
  testing::TestServerOptions o;
  o.scheduler.prefix_caching = true;
  testing::TestServer server(o);
  auto [rc, j] = run_agent_bench(server.port());
  ASSERT_EQ(rc, 0) << j.dump(2);
  by_conversation(j);  // the history still grows by the output's length
  for (const json& t : j["turn_records"]) EXPECT_FALSE(t["ids_returned"].get<bool>());
  auto run = [&](std::vector<std::string> a) { return testing::run_bench_serve(server.port(), a).first; };
  EXPECT_THROW(run({"--agent", "2", "--append-min", "20", "--append-max", "10"}), Error);
  EXPECT_THROW(run({"--agent", "2", "--background-streams", "2"}), Error);
  EXPECT_THROW(run({"--turns", "2"}), Error);  // without --agent
  EXPECT_TRUE(server.drained());
}

}  // namespace
}  // namespace megadecode
