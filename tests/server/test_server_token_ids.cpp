// The server without a tokenizer (`serve --skip-tokenizer-init`) over HTTP on the fake backend:
// token-id prompts, whole and streamed, come back as "token_ids" (the fake model's greedy and
// seeded outputs) with empty text, usage, and the finish reasons of max_tokens, end tokens and
// stop_token_ids; every field that needs text is a 400 naming it, and the server keeps serving.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::HttpResult;
using testing::kFakeEos;
using testing::post_json;
using testing::sse_data;
using testing::TestServer;
using testing::TestServerOptions;

TestServerOptions no_tokenizer() {
  TestServerOptions o;
  o.skip_tokenizer = true;
  return o;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// The fake model's greedy reply to `prompt`: up to max_tokens, or through the first `end` token.
std::vector<int32_t> greedy_reply(const std::vector<int32_t>& prompt, int max_tokens, int32_t end = kFakeEos) {
  std::vector<int32_t> t = testing::fake_reference(prompt, greedy(), max_tokens);
  if (auto at = std::find(t.begin(), t.end(), end); at != t.end()) t.erase(at + 1, t.end());
  return t;
}

// The first three-token prompt whose greedy reply of up to `n` tokens ends on the end token (after
// at least three tokens: ends = true) or does not end early (ends = false).
std::vector<int32_t> prompt_where(bool ends, int n) {
  for (int32_t a = 40; a < 120; ++a) {
    for (int32_t b = 40; b < 120; ++b) {
      const std::vector<int32_t> p = {a, b, 32};
      const std::vector<int32_t> reply = greedy_reply(p, n);
      if (ends ? reply.back() == kFakeEos && reply.size() >= 3 : static_cast<int>(reply.size()) == n &&
                                                                      reply.back() != kFakeEos)
        return p;
    }
  }
  ADD_FAILURE() << "no prompt found";
  return {65, 66, 67};
}

std::vector<int32_t> ids(const json& j) { return j.get<std::vector<int32_t>>(); }

TEST(ServerTokenIds, CompletionReturnsTheGeneratedIds) {
  TestServer server(no_tokenizer());
  const std::vector<int32_t> prompt = prompt_where(false, 12);
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"model", "fake-model"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(ids(c["token_ids"]), greedy_reply(prompt, 12));
  EXPECT_EQ(c["token_ids"].size(), 12u);
  EXPECT_EQ(c["text"], "");
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_TRUE(c["stop_reason"].is_null());
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], 15);
  EXPECT_TRUE(server.drained());
}

TEST(ServerTokenIds, SeveralPromptsAndSeededChoices) {
  TestServer server(no_tokenizer());
  const std::vector<std::vector<int32_t>> prompts = {{72, 105, 33}, {1, 2, 3, 4, 5, 6, 7}};
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"prompt", prompts}, {"n", 2}, {"seed", 7}, {"temperature", 0.8}, {"max_tokens", 9},
                            {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["choices"].size(), 4u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int i = 0; i < 2; ++i) {
      SamplingParams sp;
      sp.temperature = 0.8f;
      sp.seed = 7 + i;  // choice i samples with seed + i
      const json& c = j["choices"][p * 2 + i];
      EXPECT_EQ(c["index"], p * 2 + i);
      EXPECT_EQ(ids(c["token_ids"]), testing::fake_reference(prompts[p], sp, 9)) << "prompt " << p << " choice " << i;
      EXPECT_EQ(c["text"], "");
    }
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 36);
}

TEST(ServerTokenIds, StreamedChunksCarryTheirIds) {
  TestServer server(no_tokenizer());
  const std::vector<int32_t> prompt = prompt_where(false, 10);
  HttpResult r = post_json(server.port(), "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"stream", true},
                            {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["Content-Type"], "text/event-stream");
  const std::vector<std::string> events = sse_data(r.body);
  ASSERT_EQ(events.size(), 12u) << r.body;  // one chunk per token, the usage chunk, [DONE]
  std::vector<int32_t> got;
  for (size_t k = 0; k < 10; ++k) {
    const json chunk = json::parse(events[k]);
    ASSERT_EQ(chunk["choices"].size(), 1u) << events[k];
    const json& c = chunk["choices"][0];
    EXPECT_EQ(c["token_ids"].size(), 1u) << events[k];
    EXPECT_EQ(c["text"], "");
    EXPECT_EQ(c["finish_reason"], k == 9 ? json("length") : json(nullptr)) << events[k];
    for (int32_t t : ids(c["token_ids"])) got.push_back(t);
  }
  EXPECT_EQ(got, greedy_reply(prompt, 10));
  const json usage = json::parse(events[10]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 10);
  EXPECT_EQ(events[11], "[DONE]");
  EXPECT_TRUE(server.drained());
}

TEST(ServerTokenIds, StreamOfSeveralChoicesSumsToTheWholeResponse) {
  TestServer server(no_tokenizer());
  const json body = {{"prompt", {{10, 20, 30}, {40, 50}}}, {"n", 2}, {"seed", 3}, {"temperature", 1.0},
                     {"max_tokens", 7}};
  HttpResult whole = post_json(server.port(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json streamed_body = body;
  streamed_body["stream"] = true;
  HttpResult streamed = post_json(server.port(), "/v1/completions", streamed_body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::map<int, std::vector<int32_t>> got;
  std::map<int, std::string> finish;
  for (const std::string& e : sse_data(streamed.body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    for (const json& c : chunk["choices"]) {
      for (int32_t t : ids(c["token_ids"])) got[c["index"].get<int>()].push_back(t);
      if (!c["finish_reason"].is_null()) finish[c["index"].get<int>()] = c["finish_reason"];
    }
  }
  const json choices = whole.json()["choices"];
  ASSERT_EQ(choices.size(), 4u);
  for (const json& c : choices) {
    const int i = c["index"];
    EXPECT_EQ(got[i], ids(c["token_ids"])) << "choice " << i;
    EXPECT_EQ(finish[i], c["finish_reason"].get<std::string>()) << "choice " << i;
  }
}

TEST(ServerTokenIds, EndTokensAndStopTokenIdsEndTheReply) {
  TestServer server(no_tokenizer());
  // The model's end token (from the config, the only source without a tokenizer).
  const std::vector<int32_t> ending = prompt_where(true, 40);
  const std::vector<int32_t> reply = greedy_reply(ending, 40);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    HttpResult r = post_json(server.port(), "/v1/completions",
                             {{"prompt", ending}, {"max_tokens", 40}, {"temperature", 0}, {"stream", stream}});
    ASSERT_EQ(r.status, 200) << r.body;
    std::vector<int32_t> got;
    json last;
    if (stream) {
      for (const std::string& e : sse_data(r.body)) {
        if (e == "[DONE]") continue;
        last = json::parse(e)["choices"][0];
        for (int32_t t : ids(last["token_ids"])) got.push_back(t);
      }
    } else {
      last = r.json()["choices"][0];
      got = ids(last["token_ids"]);
    }
    EXPECT_EQ(got, reply);
    EXPECT_EQ(got.back(), kFakeEos);
    EXPECT_EQ(last["finish_reason"], "stop");
    EXPECT_TRUE(last["stop_reason"].is_null());
  }
  // ignore_eos: the same prompt runs to max_tokens.
  HttpResult ignored = post_json(server.port(), "/v1/completions",
                                 {{"prompt", ending}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(ignored.status, 200) << ignored.body;
  EXPECT_EQ(ignored.json()["choices"][0]["token_ids"].size(), 40u);
  EXPECT_EQ(ignored.json()["choices"][0]["finish_reason"], "length");

  // stop_token_ids: the third token of a reply ends it there, named in stop_reason.
  const std::vector<int32_t> prompt = prompt_where(false, 12);
  const int32_t stop = greedy_reply(prompt, 12)[2];
  HttpResult s = post_json(server.port(), "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0},
                            {"stop_token_ids", json::array({stop})}});
  ASSERT_EQ(s.status, 200) << s.body;
  const json c = s.json()["choices"][0];
  EXPECT_EQ(ids(c["token_ids"]), greedy_reply(prompt, 12, stop));
  EXPECT_EQ(c["token_ids"].back(), stop);
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["stop_reason"], stop);
  EXPECT_EQ(s.json()["usage"]["completion_tokens"], c["token_ids"].size());
  EXPECT_TRUE(server.drained());
}

void expect_refused(const HttpResult& r, const std::string& param, const std::string& reason) {
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.headers.at("Content-Type"), "application/json");  // an error, never a stream
  const json e = r.json()["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["param"], param.empty() ? json(nullptr) : json(param)) << r.body;
  const std::string message = e["message"];
  EXPECT_EQ(message.rfind("this server runs with --skip-tokenizer-init: ", 0), 0u) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
}

TEST(ServerTokenIds, WhatNeedsTextIsRefusedByName) {
  TestServer server(no_tokenizer());
  const json ok = {{"prompt", {72, 105}}, {"max_tokens", 3}};
  struct Case {
    json extra;
    std::string param, reason;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "Hello"}}, "prompt", "prompts must be token ids"},
      {{{"prompt", {"Hello", "world"}}}, "prompt", "prompts must be token ids"},
      {{{"prompt", {json{1, 2}, json("x")}}}, "prompt", "prompts must be token ids"},
      {{{"prompt", "Hello"}, {"stream", true}}, "prompt", "prompts must be token ids"},
      {{{"echo", true}}, "echo", "'echo'"},
      {{{"stop", "\n"}}, "stop", "'stop'"},
      {{{"stop", {"a", "b"}}}, "stop", "'stop'"},
      {{{"logprobs", 0}}, "logprobs", "'logprobs'"},
      {{{"logprobs", 3}, {"stream", true}}, "logprobs", "'logprobs'"},
  };
  for (const Case& c : cases) {
    json body = ok;
    body.update(c.extra);
    SCOPED_TRACE(body.dump());
    expect_refused(post_json(server.port(), "/v1/completions", body), c.param, c.reason);
  }
  for (const json& chat : {json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}},
                           json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", true}},
                           json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", true}}}) {
    SCOPED_TRACE(chat.dump());
    expect_refused(post_json(server.port(), "/v1/chat/completions", chat), "messages", "chat completions");
  }
  expect_refused(post_json(server.port(), "/tokenize", {{"prompt", "hi"}}), "", "/tokenize");
  expect_refused(post_json(server.port(), "/detokenize", {{"tokens", {1, 2}}}), "", "/detokenize");
  // Ordinary token-id validation is unchanged.
  HttpResult oov = post_json(server.port(), "/v1/completions", {{"prompt", {999999}}});
  ASSERT_EQ(oov.status, 400);
  EXPECT_NE(oov.body.find("out of vocabulary"), std::string::npos) << oov.body;

  // Fields that need no text, or are given as their "none", are served; so is everything after
  // the refusals, on one keep-alive connection.
  HttpClient c(server.port());
  for (const json& extra : {json{{"stop", json::array()}}, json{{"stop", nullptr}}, json{{"logprobs", nullptr}},
                            json{{"echo", false}}, json{{"skip_special_tokens", false}},
                            json{{"add_special_tokens", true}}, json{{"min_tokens", 2}}}) {
    json body = ok;
    body.update(extra);
    HttpResult r = c.request("POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << body.dump() << ": " << r.body;
    EXPECT_EQ(r.json()["choices"][0]["text"], "");
    EXPECT_FALSE(r.json()["choices"][0]["token_ids"].empty());
  }
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  HttpResult models = c.request("GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json()["data"][0]["id"], "fake-model");
  EXPECT_TRUE(server.drained());
}

// The tokenizer path is untouched: no "token_ids" in its responses.
TEST(ServerTokenIds, ATokenizerServerSendsNoTokenIds) {
  TestServer server;
  HttpResult r = post_json(server.port(), "/v1/completions", {{"prompt", {72, 105}}, {"max_tokens", 4}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.json()["choices"][0].contains("token_ids")) << r.body;
  HttpResult s = post_json(server.port(), "/v1/completions",
                           {{"prompt", {72, 105}}, {"max_tokens", 4}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.body.find("token_ids"), std::string::npos) << s.body;
  EXPECT_EQ(post_json(server.port(), "/tokenize", {{"prompt", "hi"}}).status, 200);
}

}  // namespace
}  // namespace megadecode
