// The OpenAI API end to end over HTTP on the fake backend: response shapes, streaming, usage and
// cached tokens, n and seeds, stop strings, logprobs, echo, the small endpoints, one test per
// error status, and freeing everything when a client disconnects mid-stream.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::HttpResult;
using testing::post_json;
using testing::sse_data;
using testing::TestServer;
using testing::wait_until;

// What greedy decoding of the fake model gives for `prompt`: tokens up to EOS or max_tokens.
struct Expected {
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;
};
Expected expected(const std::string& prompt, int max_tokens, float temperature = 0.0f, uint64_t seed = 0) {
  std::vector<int32_t> p = testing::FakeTokenizer().encode(prompt, true);
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  Expected e;
  e.tokens = testing::fake_reference(p, sp, max_tokens);
  e.finish_reason = "length";
  auto eos = std::find(e.tokens.begin(), e.tokens.end(), testing::kFakeEos);
  if (eos != e.tokens.end()) {
    e.tokens.erase(eos + 1, e.tokens.end());
    e.finish_reason = "stop";
  }
  e.text = testing::fake_text(e.tokens);
  return e;
}

TEST(ServerApi, CompletionShapeTextAndUsage) {
  TestServer server;
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"model", "fake-model"}, {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["Content-Type"], "application/json");
  json j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  Expected e = expected("Once upon a time", 12);
  EXPECT_EQ(j["choices"][0]["text"], e.text);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["finish_reason"], e.finish_reason);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 16);
  EXPECT_EQ(j["usage"]["completion_tokens"], e.tokens.size());
  EXPECT_EQ(j["usage"]["total_tokens"], 16 + e.tokens.size());
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_TRUE(server.drained());
}

TEST(ServerApi, RepeatedPromptReportsCachedTokens) {
  TestServer server;
  json body = {{"prompt", "A shared prefix that spans several blocks."}, {"max_tokens", 3}, {"temperature", 0}};
  HttpResult a = post_json(server.port(), "/v1/completions", body);
  HttpResult b = post_json(server.port(), "/v1/completions", body);
  ASSERT_EQ(b.status, 200);
  EXPECT_EQ(a.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // 42 prompt tokens, 41 cacheable, block size 4: 40 tokens come from the cache.
  EXPECT_EQ(b.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 40);
  EXPECT_EQ(a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]);
}

TEST(ServerApi, ChatStreamEqualsNonStream) {
  TestServer server;
  json body = {{"model", "fake-model"},
               {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi there"}}}},
               {"max_tokens", 20},
               {"temperature", 0}};
  HttpResult whole = post_json(server.port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json w = whole.json();
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["choices"][0]["message"]["role"], "assistant");
  const std::string prompt = testing::fake_render_chat(testing::user_chat({{"system", "Be brief."}, {"user", "Hi there"}}));
  Expected e = expected(prompt, 20);
  EXPECT_EQ(w["choices"][0]["message"]["content"], e.text);
  EXPECT_EQ(w["usage"]["prompt_tokens"], testing::FakeTokenizer().encode(prompt, false).size());

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  HttpResult streamed = post_json(server.port(), "/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.headers["Content-Type"], "text/event-stream");
  auto events = sse_data(streamed.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  std::string finish;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]);
    ASSERT_EQ(c["choices"].size(), 1u);
    if (c["choices"][0]["delta"].contains("content")) content += c["choices"][0]["delta"]["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, e.text);
  EXPECT_EQ(finish, e.finish_reason);
  json usage_chunk = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], w["usage"]["completion_tokens"]);
  EXPECT_TRUE(server.drained());
}

TEST(ServerApi, CompletionStreamWithoutUsageEndsWithDone) {
  TestServer server;
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"prompt", "stream me"}, {"max_tokens", 8}, {"temperature", 0}, {"stream", true}});
  ASSERT_EQ(r.status, 200);
  auto events = sse_data(r.body);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_FALSE(c.contains("usage"));
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, expected("stream me", 8).text);
}

TEST(ServerApi, SeedsAreReproducibleAndNChoicesUseSeedPlusIndex) {
  TestServer server;
  json body = {{"prompt", "Roll the dice:"}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", 1234}, {"n", 3}};
  HttpResult a = post_json(server.port(), "/v1/completions", body);
  HttpResult b = post_json(server.port(), "/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  json ja = a.json(), jb = b.json();
  ASSERT_EQ(ja["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ja["choices"][i]["index"], i);
    EXPECT_EQ(ja["choices"][i]["text"], jb["choices"][i]["text"]);
    // Sampled bytes need not form UTF-8; the server sends invalid bytes as U+FFFD.
    const std::string want = expected("Roll the dice:", 10, 1.0f, 1234 + i).text;
    EXPECT_EQ(ja["choices"][i]["text"], json::parse(json(want).dump(-1, ' ', false, json::error_handler_t::replace)))
        << "choice " << i;
  }
  EXPECT_EQ(ja["usage"]["prompt_tokens"], 14);  // counted once, not per choice
}

TEST(ServerApi, StopStringIsCutAndReported) {
  TestServer server;
  const std::string full = testing::fake_text(
      testing::fake_reference(testing::FakeTokenizer().encode("Tell me", true), SamplingParams{.temperature = 0}, 30));
  ASSERT_GE(full.size(), 6u);
  const std::string stop = full.substr(3, 2);  // occurs at or before byte 3
  const size_t at = full.find(stop);
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"prompt", "Tell me"}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true},
                            {"stop", {"never-there", stop}}});
  ASSERT_EQ(r.status, 200);
  json c = r.json()["choices"][0];
  EXPECT_EQ(c["text"], full.substr(0, at));
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["stop_reason"], stop);
}

TEST(ServerApi, CompletionLogprobsAndEcho) {
  TestServer server;
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"prompt", "abc"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 2}, {"echo", true},
                            {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json c = r.json()["choices"][0];
  Expected e = expected("abc", 4);
  EXPECT_EQ(c["text"], "abc" + testing::fake_text(e.tokens));
  json lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 7u);  // 3 prompt + 4 generated
  EXPECT_EQ(lp["tokens"][0], "a");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (int i = 1; i < 7; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_GE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
  }
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][3], 3);
}

TEST(ServerApi, ChatLogprobsShape) {
  TestServer server;
  HttpResult r = post_json(server.port(), "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 3}, {"temperature", 0},
                            {"logprobs", true}, {"top_logprobs", 2}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json content = r.json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  for (const json& t : content) {
    EXPECT_TRUE(t["token"].is_string());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(t["bytes"].is_array());
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);  // greedy: the top token is the sampled one
  }
}

TEST(ServerApi, SmallEndpoints) {
  TestServer server;
  HttpClient c(server.port());
  HttpResult h = c.request("GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_TRUE(h.body.empty());
  json models = c.request("GET", "/v1/models").json();
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "fake-model");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  json tok = c.request("POST", "/tokenize", json{{"prompt", "hi<|im_end|>"}}.dump()).json();
  EXPECT_EQ(tok["tokens"], json({'h', 'i', testing::kFakeImEnd}));
  EXPECT_EQ(tok["count"], 3);
  EXPECT_EQ(tok["max_model_len"], 512);
  json chat_tok = c.request("POST", "/tokenize", json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}.dump()).json();
  EXPECT_EQ(chat_tok["count"], testing::FakeTokenizer().encode(
      testing::fake_render_chat(testing::user_chat({{"user", "x"}})), false).size());
  json detok = c.request("POST", "/detokenize", json{{"tokens", {104, 105}}}.dump()).json();
  EXPECT_EQ(detok["prompt"], "hi");
  post_json(server.port(), "/v1/completions", {{"prompt", "metrics"}, {"max_tokens", 2}});
  HttpResult m = c.request("GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  for (const char* name : {"megadecode:num_requests_running{model_name=\"fake-model\"}", "megadecode:num_requests_waiting",
                           "megadecode:kv_cache_usage_perc", "megadecode:prompt_tokens_total{model_name=\"fake-model\"} 7",
                           "megadecode:generation_tokens_total", "megadecode:time_to_first_token_seconds_bucket",
                           "megadecode:inter_token_latency_seconds_count", "megadecode:e2e_request_latency_seconds_sum",
                           "# TYPE megadecode:time_to_first_token_seconds histogram",
                           "# TYPE megadecode:engine_step_seconds histogram",
                           "megadecode:engine_step_seconds_bucket{model_name=\"fake-model\",phase=\"schedule\",le=\"1e-06\"}",
                           "megadecode:engine_step_seconds_count{model_name=\"fake-model\",phase=\"output\"}",
                           "megadecode:engine_step_seconds_sum{model_name=\"fake-model\",phase=\"wait\"}"})
    EXPECT_NE(m.body.find(name), std::string::npos) << name;
}

// ---- one test per error ----

void expect_error(const HttpResult& r, int status, const std::string& type, const std::string& message_part = "") {
  EXPECT_EQ(r.status, status) << r.body;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_EQ(e["type"], type);
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!message_part.empty()) {
    EXPECT_NE(e["message"].get<std::string>().find(message_part), std::string::npos) << r.body;
  }
}

TEST(ServerErrors, MalformedJsonIs400) {
  TestServer server;
  HttpClient c(server.port());
  expect_error(c.request("POST", "/v1/completions", "{\"prompt\": \"x\""), 400, "invalid_request_error", "not valid JSON");
  expect_error(c.request("POST", "/v1/chat/completions", "[1, 2]"), 400, "invalid_request_error", "JSON object");
  expect_error(c.request("POST", "/v1/completions", ""), 400, "invalid_request_error");
  // Deep nesting, unbalanced and balanced: rejected without exhausting the stack.
  expect_error(c.request("POST", "/v1/completions", std::string(200000, '[')), 400, "invalid_request_error");
  const std::string deep = "{\"prompt\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_error(c.request("POST", "/v1/completions", deep), 400, "invalid_request_error");
}

TEST(ServerErrors, WrongTypesAre400) {
  TestServer server;
  for (json body : {json{{"prompt", 5}}, json{{"prompt", "x"}, {"max_tokens", "10"}}, json{{"prompt", "x"}, {"temperature", "hot"}},
                    json{{"prompt", "x"}, {"stream", 1}}, json{{"prompt", "x"}, {"stop", 3}}, json{{"prompt", "x"}, {"n", 1.5}},
                    json{{"prompt", {1, "a"}}}, json{{"prompt", "x"}, {"model", 7}}}) {
    HttpResult r = post_json(server.port(), "/v1/completions", body);
    expect_error(r, 400, "invalid_request_error");
  }
  expect_error(post_json(server.port(), "/v1/chat/completions", {{"messages", "hello"}}), 400, "invalid_request_error",
               "messages");
  expect_error(post_json(server.port(), "/v1/chat/completions", {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}),
               400, "invalid_request_error", "wizard");
}

TEST(ServerErrors, OutOfRangeValuesAre400) {
  TestServer server;
  for (json extra : {json{{"temperature", -0.5}}, json{{"top_p", 0}}, json{{"top_p", 1.5}}, json{{"max_tokens", 0}},
                     json{{"n", 0}}, json{{"logprobs", 21}}, json{{"presence_penalty", 3}}, json{{"top_k", -2}},
                     json{{"min_p", 2}}, json{{"repetition_penalty", 0}}, json{{"min_tokens", 5}, {"max_tokens", 2}},
                     json{{"stop_token_ids", {999999}}}, json{{"stream_options", {{"include_usage", true}}}}}) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    HttpResult r = post_json(server.port(), "/v1/completions", body);
    expect_error(r, 400, "invalid_request_error");
    EXPECT_FALSE(r.json()["error"]["param"].is_null()) << body.dump();
  }
  expect_error(post_json(server.port(), "/v1/completions", {{"prompt", {999999}}}), 400, "invalid_request_error",
               "out of vocabulary");
}

TEST(ServerErrors, EmptyPromptIs400) {
  TestServer server;
  for (json p : {json(""), json::array(), json({""}), json({json::array()})})
    expect_error(post_json(server.port(), "/v1/completions", {{"prompt", p}}), 400, "invalid_request_error");
  expect_error(post_json(server.port(), "/v1/chat/completions", {{"messages", json::array()}}), 400,
               "invalid_request_error");
}

TEST(ServerErrors, ContextOverflowIs400WithTheLimitInTheMessage) {
  TestServer server;  // max_model_len 512
  HttpResult a = post_json(server.port(), "/v1/completions", {{"prompt", std::string(500, 'a')}, {"max_tokens", 100}});
  expect_error(a, 400, "invalid_request_error", "This model's maximum context length is 512 tokens");
  EXPECT_NE(a.body.find("(100 > 512 - 500)"), std::string::npos) << a.body;
  HttpResult b = post_json(server.port(), "/v1/completions", {{"prompt", std::string(512, 'a')}});
  expect_error(b, 400, "invalid_request_error", "maximum context length is 512 tokens. However, your request has 512");
  // Without max_tokens a long prompt still works: the default shrinks to what fits.
  HttpResult c = post_json(server.port(), "/v1/completions", {{"prompt", std::string(505, 'a')}, {"ignore_eos", true}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json()["usage"]["completion_tokens"], 7);
}

// A value out of range is refused with the bound it crosses: the context left for max_tokens,
// not a lower bound it satisfies.
TEST(ServerErrors, MessagesNameTheBoundTheyEnforce) {
  TestServer server;  // max_model_len 512, vocabulary 260
  auto message = [&](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    HttpResult r = post_json(server.port(), "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    json j = json::parse(r.body, nullptr, false);
    return j.is_discarded() ? std::string() : j["error"]["message"].get<std::string>();
  };
  auto expect_has = [](const std::string& m, const std::string& part) {
    EXPECT_NE(m.find(part), std::string::npos) << "\"" << m << "\" does not say \"" << part << "\"";
  };
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    for (const json& huge : {json(1e12), json(int64_t{1000000000000}), json(uint64_t{1} << 40)}) {
      const std::string m = message({{field, huge}});
      expect_has(m, "maximum context length is 512 tokens");
      expect_has(m, " > 512 - 1)");
      EXPECT_EQ(m.find("at least"), std::string::npos) << m;
    }
    expect_has(message({{field, 0}}), "at least 1, got 0");
  }
  expect_has(message({{"max_tokens", 1e19}}), "must be between");
  expect_has(message({{"max_tokens", uint64_t{1} << 63}}), "must be at most 9223372036854775807");
  expect_has(message({{"min_tokens", 1e12}}), "must not exceed 'max_tokens' (16)");
  expect_has(message({{"min_tokens", -1}}), "at least 0, got -1");
  expect_has(message({{"n", 1000}}), "between 1 and 128, got 1000");
  expect_has(message({{"logprobs", 21}}), "between 0 and 20, got 21");
  expect_has(message({{"top_k", -5}}), "between -1 and 2147483647, got -5");
  expect_has(message({{"top_k", 1e10}}), "between -1 and 2147483647, got 10000000000");
  json prompt = {{"prompt", {1, 2, testing::kFakeVocab}}};
  expect_has(message(prompt), "Token id 260 is out of vocabulary: prompt token ids must be below 260");
  prompt = {{"prompt", {int64_t{3000000000}}}};
  expect_has(message(prompt), "token id 3000000000 is out of vocabulary");
  HttpResult detok = post_json(server.port(), "/detokenize", {{"tokens", {1, uint64_t{1} << 63}}});
  expect_error(detok, 400, "invalid_request_error", "token ids in [0, 260)");
}

TEST(ServerErrors, UnknownModelAndRouteAre404) {
  TestServer server;
  HttpResult m = post_json(server.port(), "/v1/completions", {{"model", "gpt-5"}, {"prompt", "x"}});
  expect_error(m, 404, "invalid_request_error", "The model `gpt-5` does not exist.");
  EXPECT_EQ(m.json()["error"]["code"], "model_not_found");
  HttpClient c(server.port());
  expect_error(c.request("GET", "/v2/nothing"), 404, "invalid_request_error");
  expect_error(c.request("POST", "/v1/embeddings", "{}"), 404, "invalid_request_error");
  HttpResult wrong_method = c.request("GET", "/v1/completions");
  expect_error(wrong_method, 405, "invalid_request_error");
  EXPECT_EQ(wrong_method.headers["Allow"], "POST");
}

TEST(ServerErrors, OversizedBodyIs413) {
  testing::TestServerOptions o;
  o.max_body_bytes = 4096;
  TestServer server(o);
  HttpResult r = post_json(server.port(), "/v1/completions", {{"prompt", std::string(10000, 'a')}});
  expect_error(r, 413, "invalid_request_error", "larger than the limit");
  // The server is fine afterwards.
  EXPECT_EQ(HttpClient(server.port()).request("GET", "/health").status, 200);
}

TEST(ServerErrors, FullQueueIs503WithRetryAfter) {
  testing::TestServerOptions o;
  o.scheduler.max_num_seqs = 1;
  o.max_waiting = 2;
  o.backend_delay_us = 2000;
  TestServer server(o);
  // Fill: one running and two waiting, streaming so that they stay open.
  std::vector<std::unique_ptr<HttpClient>> held;
  json slow = {{"prompt", "slow"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<HttpClient>(server.port()));
    namespace http = boost::beast::http;
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "x");
    req.set(http::field::content_type, "application/json");
    req.body() = slow.dump();
    req.prepare_payload();
    http::write(held.back()->socket(), req);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  HttpResult r = post_json(server.port(), "/v1/completions", {{"prompt", "one more"}, {"max_tokens", 2}});
  expect_error(r, 503, "server_error", "waiting queue is full");
  EXPECT_EQ(r.headers["Retry-After"], "1");
  // A streaming request is refused the same way, before any stream starts.
  HttpResult s = post_json(server.port(), "/v1/completions", {{"prompt", "more"}, {"max_tokens", 2}, {"stream", true}});
  expect_error(s, 503, "server_error", "waiting queue is full");
  EXPECT_EQ(s.headers["Retry-After"], "1");
  held.clear();  // disconnects abort the held requests
  EXPECT_TRUE(server.drained());
}

TEST(ServerApi, ClientDisconnectMidStreamFreesEverything) {
  testing::TestServerOptions o;
  o.backend_delay_us = 500;
  TestServer server(o);
  {
    HttpClient c(server.port());
    namespace http = boost::beast::http;
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "x");
    req.set(http::field::content_type, "application/json");
    req.body() = json{{"prompt", "long"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.prepare_payload();
    http::write(c.socket(), req);
    char buf[256];
    c.socket().read_some(boost::asio::buffer(buf));  // the stream has started
  }  // closes the connection
  EXPECT_TRUE(wait_until([&] { return server.engine->metrics().finished[static_cast<size_t>(FinishReason::kAbort)] == 1; }));
  EXPECT_TRUE(server.drained());
  EXPECT_EQ(HttpClient(server.port()).request("GET", "/health").status, 200);
}

TEST(ServerApi, NonStreamingDisconnectAborts) {
  testing::TestServerOptions o;
  o.backend_delay_us = 500;
  TestServer server(o);
  {
    HttpClient c(server.port());
    namespace http = boost::beast::http;
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "x");
    req.set(http::field::content_type, "application/json");
    req.body() = json{{"prompt", "long"}, {"max_tokens", 400}, {"ignore_eos", true}}.dump();
    req.prepare_payload();
    http::write(c.socket(), req);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(wait_until([&] { return server.engine->metrics().finished[static_cast<size_t>(FinishReason::kAbort)] == 1; }));
  EXPECT_TRUE(server.drained());
}

TEST(ServerApi, ExpectContinueIsAnswered) {
  TestServer server;
  HttpClient c(server.port());
  const std::string body = json{{"prompt", "continue"}, {"max_tokens", 2}}.dump();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Expect: 100-continue\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  boost::asio::write(c.socket(), boost::asio::buffer(head));
  std::string got(25, '\0');
  boost::asio::read(c.socket(), boost::asio::buffer(got));  // arrives without the body being sent
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  boost::asio::write(c.socket(), boost::asio::buffer(body));
  boost::beast::flat_buffer buffer;
  boost::beast::http::response<boost::beast::http::string_body> res;
  boost::beast::http::read(c.socket(), buffer, res);
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_TRUE(json::parse(res.body()).contains("choices"));
}

TEST(ServerApi, GenerationConfigDefaultsApply) {
  testing::TestServerOptions o;
  o.defaults.sampling.temperature = 0.0f;  // greedy unless the request says otherwise
  o.defaults.max_new_tokens = 5;
  TestServer server(o);
  HttpResult r = post_json(server.port(), "/v1/completions", {{"prompt", "defaults"}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json()["choices"][0]["text"], testing::fake_text(expected("defaults", 5).tokens));
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 5);
}

}  // namespace
}  // namespace megadecode
