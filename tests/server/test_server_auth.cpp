// API keys (server/api_key.h): with a key, every route but /health and /metrics answers 401
// (OpenAI's shape, code invalid_api_key) without "Authorization: Bearer KEY" or with a wrong key;
// --protect-metrics closes /metrics too. The comparison is checked on random keys.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/rng.h"
#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::HttpResult;
using testing::TestServer;
using testing::TestServerOptions;

std::string random_key(SplitMix64& rng, size_t n) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.";
  std::string k;
  for (size_t i = 0; i < n; ++i) k += kChars[rng.below(sizeof kChars - 1)];
  return k;
}

void expect_401(const HttpResult& r) {
  EXPECT_EQ(r.status, 401) << r.body;
  json e = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(e.is_discarded()) << r.body;
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(r.headers.count("WWW-Authenticate"), 1u);
}

TEST(ApiKey, ConstantTimeEqualIsEquality) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    const std::string a = random_key(rng, rng.below(40));
    std::string b = rng.below(2) ? a : random_key(rng, rng.below(40));
    if (!b.empty() && rng.below(3) == 0) b[rng.below(b.size())] ^= 1;  // one bit off
    if (rng.below(5) == 0) b = a + std::string(1, 'x');                // a prefix of the other
    EXPECT_EQ(constant_time_equal(a, b), a == b) << "\"" << a << "\" vs \"" << b << "\"";
    EXPECT_EQ(constant_time_equal(b, a), a == b);
  }
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal("", "k"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(ApiKey, GuardReadsTheBearerScheme) {
  ApiKeyGuard guard("sk-test", false);
  EXPECT_TRUE(guard.accepts("Bearer sk-test"));
  EXPECT_TRUE(guard.accepts("bearer sk-test"));
  EXPECT_TRUE(guard.accepts("BEARER  sk-test "));
  for (const char* bad : {"", "Bearer", "Bearer ", "sk-test", "Basic sk-test", "Bearer sk-tes", "Bearer sk-testx",
                          "Bearer SK-TEST", "Bearersk-test"})
    EXPECT_FALSE(guard.accepts(bad)) << bad;
  EXPECT_FALSE(ApiKeyGuard().protects("/v1/models"));
  EXPECT_TRUE(guard.protects("/v1/chat/completions"));
  EXPECT_TRUE(guard.protects("/tokenize"));
  EXPECT_FALSE(guard.protects("/health"));
  EXPECT_FALSE(guard.protects("/metrics"));
  EXPECT_TRUE(ApiKeyGuard("k", true).protects("/metrics"));
  EXPECT_THROW(ApiKeyGuard("has space", false), Error);
}

TEST(ServerAuth, EveryApiRouteNeedsTheKey) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const std::string key = random_key(rng, 16 + rng.below(48));
  TestServerOptions o;
  o.api_key = ApiKeyGuard(key, false);
  TestServer server(o);
  HttpClient c(server.port());
  // ignore_eos: the random-weight model may sample its EOS token before the third token.
  const std::string completion = json{{"prompt", "auth"}, {"max_tokens", 3}, {"ignore_eos", true}}.dump();
  std::string wrong = key;
  wrong[rng.below(wrong.size())] ^= 0x01;
  const std::vector<HttpHeaders> refused = {{},
                                            {{"Authorization", "Bearer " + wrong}},
                                            {{"Authorization", "Bearer " + key.substr(0, key.size() - 1)}},
                                            {{"Authorization", "Bearer " + key + "x"}},
                                            {{"Authorization", key}},
                                            {{"Authorization", "Basic " + key}}};
  for (const HttpHeaders& h : refused) {
    SCOPED_TRACE(h.empty() ? std::string("no Authorization") : h[0].second);
    expect_401(c.request("POST", "/v1/completions", completion, "application/json", h));
    expect_401(c.request("POST", "/v1/chat/completions", "{}", "application/json", h));
    expect_401(c.request("GET", "/v1/models", "", "application/json", h));
    expect_401(c.request("POST", "/tokenize", "{}", "application/json", h));
    expect_401(c.request("GET", "/v1/nothing", "", "application/json", h));  // no hint which routes exist
  }
  const HttpHeaders good = {{"Authorization", "Bearer " + key}};
  HttpResult r = c.request("POST", "/v1/completions", completion, "application/json", good);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c.request("GET", "/v1/models", "", "application/json", good).status, 200);
  EXPECT_EQ(c.request("GET", "/v1/nothing", "", "application/json", good).status, 404);
  // Probes and scrapers need no key.
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  EXPECT_EQ(c.request("GET", "/metrics").status, 200);
  EXPECT_TRUE(server.drained());
}

TEST(ServerAuth, ProtectMetricsClosesMetricsButNotHealth) {
  TestServerOptions o;
  o.api_key = ApiKeyGuard("metrics-key", true);
  TestServer server(o);
  HttpClient c(server.port());
  expect_401(c.request("GET", "/metrics"));
  expect_401(c.request("GET", "/metrics", "", "", {{"Authorization", "Bearer other"}}));
  HttpResult m = c.request("GET", "/metrics", "", "", {{"Authorization", "Bearer metrics-key"}});
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("megadecode:num_requests_running"), std::string::npos);
  EXPECT_EQ(c.request("GET", "/health").status, 200);
}

}  // namespace
}  // namespace megadecode
