// Fuzz of request bodies: >= 10,000 random and mutated JSON bodies (valid requests, wrong types,
// out-of-range values, unknown fields, broken JSON text, invalid UTF-8, odd paths) sent over
// keep-alive connections. Every response must be well-formed HTTP with the status the input
// calls for and a valid JSON body (or a valid SSE stream), and the server must end healthy with
// no KV block held.
// sanitize: address
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::HttpResult;

json random_scalar(SplitMix64& rng) {
  switch (rng.below(9)) {
    case 0: return nullptr;
    case 1: return rng.below(2) == 0;
    case 2: return static_cast<int64_t>(rng.below(40)) - 5;
    case 3: return static_cast<int64_t>(rng.next());
    case 4: return (rng.unit() - 0.3) * 4.0;
    case 5: return 1e300;
    case 6: return std::string(rng.below(5), 'x');
    case 7: return json::array({1, 2});
    default: return json::object({{"a", 1}});
  }
}

std::string random_text(SplitMix64& rng, int max_len) {
  std::string s;
  const int n = static_cast<int>(rng.below(max_len + 1));
  for (int i = 0; i < n; ++i) {
    const uint64_t k = rng.below(20);
    if (k == 0) s += static_cast<char>(0x80 + rng.below(0x80));  // stray byte: invalid UTF-8
    else if (k == 1) s += "<|im_end|>";
    else if (k == 2) s += "é";
    else s += static_cast<char>(32 + rng.below(95));
  }
  return s;
}

json valid_request(SplitMix64& rng, bool chat) {
  json r;
  if (rng.below(3) != 0) r["model"] = "fake-model";
  if (chat) {
    json msgs = json::array();
    const int n = 1 + static_cast<int>(rng.below(3));
    const char* roles[] = {"system", "user", "assistant"};
    for (int i = 0; i < n; ++i) msgs.push_back({{"role", roles[rng.below(3)]}, {"content", random_text(rng, 20)}});
    r["messages"] = msgs;
  } else {
    switch (rng.below(4)) {
      case 0: r["prompt"] = random_text(rng, 30); break;
      case 1: r["prompt"] = json::array({random_text(rng, 10), random_text(rng, 10)}); break;
      case 2: {
        json ids = json::array();
        for (int i = 0, n = static_cast<int>(rng.below(8)); i < n; ++i) ids.push_back(rng.below(testing::kFakeVocab));
        r["prompt"] = ids;
        break;
      }
      default: r["prompt"] = json::array({json::array({65, 66}), json::array({67})});
    }
    if (rng.below(5) == 0) r["echo"] = true;
    if (rng.below(5) == 0) r["logprobs"] = rng.below(4);
  }
  r["max_tokens"] = 1 + rng.below(6);
  if (rng.below(2) == 0) r["temperature"] = rng.unit() * 1.5;
  if (rng.below(4) == 0) r["top_p"] = 0.1 + 0.9 * rng.unit();
  if (rng.below(4) == 0) r["top_k"] = static_cast<int64_t>(rng.below(50)) - 1;
  if (rng.below(4) == 0) r["seed"] = rng.next() >> 1;
  if (rng.below(4) == 0) r["n"] = 1 + rng.below(3);
  if (rng.below(4) == 0) r["stop"] = rng.below(2) ? json(random_text(rng, 3)) : json::array({"a", "bc"});
  if (rng.below(6) == 0) r["min_tokens"] = rng.below(2);
  if (rng.below(6) == 0) r["ignore_eos"] = true;
  if (rng.below(6) == 0) r["repetition_penalty"] = 0.5 + rng.unit();
  if (rng.below(3) == 0) {
    r["stream"] = true;
    if (rng.below(2) == 0) r["stream_options"] = {{"include_usage", true}};
  }
  if (chat && rng.below(5) == 0) {
    r["logprobs"] = true;
    r["top_logprobs"] = rng.below(3);
  }
  return r;
}

void mutate(SplitMix64& rng, json& r) {
  static const char* fields[] = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
                                 "top_p", "top_k", "min_p", "seed", "n", "stop", "stop_token_ids", "ignore_eos",
                                 "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                 "logprobs", "top_logprobs", "echo", "stream", "stream_options", "logit_bias",
                                 "tools", "response_format", "suffix", "best_of", "user", "unknown_field"};
  const int n = 1 + static_cast<int>(rng.below(3));
  for (int i = 0; i < n; ++i) {
    const char* f = fields[rng.below(std::size(fields))];
    if (rng.below(4) == 0) r.erase(f);
    else r[f] = random_scalar(rng);
  }
}

std::string mangle(SplitMix64& rng, std::string text) {
  switch (rng.below(5)) {
    case 0: return text.substr(0, rng.below(text.size() + 1));
    case 1:
      if (!text.empty()) text[rng.below(text.size())] = static_cast<char>(rng.below(256));
      return text;
    case 2: return text.insert(rng.below(text.size() + 1), std::string(1, "{}[],:\"\\"[rng.below(8)]));
    case 3: return text + text;
    default: {
      std::string s;
      for (int i = 0, n = static_cast<int>(rng.below(40)); i < n; ++i) s += static_cast<char>(rng.below(256));
      return s;
    }
  }
}

// Checks one response against the request; returns a failure description or "".
std::string check(const std::string& path, const std::string& body, const HttpResult& r) {
  const json req = json::parse(body, nullptr, false);
  const bool known = path == "/v1/completions" || path == "/v1/chat/completions";
  const bool stream_ok = r.status == 200 && r.headers.count("Content-Type") && r.headers.at("Content-Type") == "text/event-stream";
  if (stream_ok) {
    auto events = testing::sse_data(r.body);
    if (events.empty() || events.back() != "[DONE]") return "stream without [DONE]";
    for (size_t i = 0; i + 1 < events.size(); ++i)
      if (json::parse(events[i], nullptr, false).is_discarded()) return "invalid JSON event: " + events[i];
    return "";
  }
  const json out = json::parse(r.body, nullptr, false);
  if (out.is_discarded() || !out.is_object()) return "response body is not a JSON object";
  if (!known) return r.status == 404 && out.contains("error") ? "" : "unknown path without 404";
  if (req.is_discarded() || !req.is_object()) return r.status == 400 && out.contains("error") ? "" : "bad JSON not 400";
  if (r.status == 200) return out.contains("choices") && out.contains("usage") ? "" : "200 without choices/usage";
  if (r.status != 400 && r.status != 404) return "unexpected status " + std::to_string(r.status);
  if (!out.contains("error") || !out["error"].contains("message") || !out["error"].contains("type")) return "error shape";
  const bool wrong_model = req.contains("model") && req["model"].is_string() && req["model"] != "fake-model";
  if (r.status == 404 && !wrong_model) return "404 without a wrong model";
  return "";
}

TEST(ServerFuzz, TenThousandBodies) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  testing::TestServerOptions o;
  o.scheduler.check_invariants = false;  // checked once at the end; speed
  testing::TestServer server(o);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2600;
  std::atomic<int> n_done{0}, n_ok{0}, n_400{0}, n_404{0};
  std::vector<std::string> failures;
  std::mutex failures_mutex;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SplitMix64 rng(seed + t);
      auto client = std::make_unique<HttpClient>(server.port());
      for (int i = 0; i < kPerThread; ++i) {
        const bool chat = rng.below(2) == 0;
        std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
        json req = valid_request(rng, chat);
        const uint64_t kind = rng.below(10);
        if (kind < 5) mutate(rng, req);
        std::string body = req.dump(-1, ' ', false, json::error_handler_t::replace);
        if (kind == 5 || kind == 6) body = mangle(rng, body);
        if (kind == 7 && rng.below(4) == 0) path = rng.below(2) ? "/v1/nothing" : "/v1/completions/x";
        HttpResult r;
        try {
          r = client->request("POST", path, body);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(failures_mutex);
          failures.push_back(std::string("transport: ") + e.what() + " for " + body.substr(0, 200));
          client = std::make_unique<HttpClient>(server.port());
          continue;
        }
        std::string problem = check(path, body, r);
        if (!problem.empty()) {
          std::lock_guard<std::mutex> lock(failures_mutex);
          failures.push_back(problem + " (status " + std::to_string(r.status) + ") for " + path + " " +
                             body.substr(0, 300) + " -> " + r.body.substr(0, 300));
        }
        ++n_done;
        n_ok += r.status == 200;
        n_400 += r.status == 400;
        n_404 += r.status == 404;
      }
    });
  }
  for (auto& th : threads) th.join();
  std::printf("%d bodies: %d ok, %d 400, %d 404\n", n_done.load(), n_ok.load(), n_400.load(), n_404.load());
  for (size_t i = 0; i < failures.size() && i < 10; ++i) ADD_FAILURE() << failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures";
  EXPECT_GE(n_done.load(), 10000);
  EXPECT_GT(n_ok.load(), 2000);   // the fuzz must exercise generation, not only errors
  EXPECT_GT(n_400.load(), 2000);
  EXPECT_TRUE(server.drained());
  EXPECT_EQ(HttpClient(server.port()).request("GET", "/health").status, 200);
}

}  // namespace
}  // namespace megadecode
