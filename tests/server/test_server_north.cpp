// North Mini Code as its users call it, over HTTP: the scripted backend behind a model folder that
// holds only a North tokenizer.json (the synthetic one make-model writes: North's special tokens
// and pipeline) and a tokenizer_config.json carrying the cmd4 template, so the template and the
// cohere_command4 parsers are found by the server alone and every marker is one token. The
// backend emits the token ids of cmd4 replies: reasoning then an action block; after the tool
// result, reasoning then text. Also what is refused (conversations the template cannot render)
// and what is never an error (a malformed action block).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat_exchange.h"
#include "core/rng.h"
#include "tokenizer/north_synthetic.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::both_ways;
using testing::cmd4_action;
using testing::post_json;
using testing::ScriptedServer;
using testing::user;
using testing::weather_tools;

constexpr uint64_t kVocabSeed = 45;

// A model folder with North's tokenizer files and nothing else, made once per test suite.
class NorthServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("megadecode-north-server-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ifstream in(testing::cmd4_template());
    std::stringstream text;
    text << in.rdbuf();
    ASSERT_FALSE(text.str().empty()) << testing::cmd4_template();
    std::ofstream(dir_ / "tokenizer.json") << north_tokenizer_json(kVocabSeed, kNorthVocabSize, north_pre_tokenizer()).dump();
    std::ofstream(dir_ / "tokenizer_config.json") << north_tokenizer_config_json(text.str()).dump();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    seed_ = test_seed();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
  }

  static fs::path dir_;
  uint64_t seed_ = 0;
};
fs::path NorthServer::dir_;

int32_t id_of(const ScriptedServer& server, const char* token) {
  const auto id = server.tokenizer().token_id(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

size_t count(const std::vector<int32_t>& ids, int32_t id) { return static_cast<size_t>(std::count(ids.begin(), ids.end(), id)); }

std::string random_city(uint64_t seed) {
  static const char* const kCities[] = {"Paris", "Lima", "Quito", "Oslo", "Hanoi", "Accra", "Perth", "Cusco"};
  SplitMix64 rng(seed);
  return std::string(kCities[rng.below(8)]) + "-" + std::to_string(rng.below(1000));
}

// The whole loop (testing::cmd4_tool_loop: chat with tools -> reasoning and a call, the call and
// its result sent back -> reasoning and an answer; each request whole and streamed), here with
// every marker one token: in the replies the backend emits, in the prompts, and in usage.
TEST_F(NorthServer, ChatToolCallAndToolResultRoundTrip) {
  ScriptedServer server(ChatFamily::kCmd4, {}, dir_);
  EXPECT_EQ(server.end_token(), kNorthEosToken);
  const std::string city = random_city(seed_);
  const std::string call_reply = "The user wants the weather in " + city + ".<|END_THINKING|>" + cmd4_action({city});
  const std::vector<int32_t> call_ids = server.encode(call_reply);
  EXPECT_EQ(count(call_ids, id_of(server, "<|END_THINKING|>")), 1u);
  EXPECT_EQ(count(call_ids, id_of(server, "<|START_ACTION|>")), 1u);
  EXPECT_EQ(count(call_ids, id_of(server, "<|END_ACTION|>")), 1u);

  const testing::Cmd4Loop loop = testing::cmd4_tool_loop(server, city);
  const json& m = loop.call["choices"][0]["message"];
  ASSERT_EQ(m.value("tool_calls", json::array()).size(), 1u) << m.dump();
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", city}}));
  EXPECT_GE(loop.call_streamed.n_argument_chunks, 1);
  EXPECT_EQ(loop.call_streamed.finish_reason, "tool_calls");
  EXPECT_EQ(loop.answer_streamed.content, "It is 18 C and sunny in " + city + ".");
  EXPECT_EQ(loop.answer_streamed.reasoning, "It is sunny.");

  // The prompts: one <BOS_TOKEN> (the template's; the post-processor adds none to a chat prompt),
  // the generation prompt as three special tokens, the call and its result as single markers.
  const auto prompts = server.prompt_ids();
  ASSERT_GE(prompts.size(), 4u);  // each request whole and streamed
  const std::vector<int32_t>& first = prompts[0];
  ASSERT_GE(first.size(), 4u);
  EXPECT_EQ(first[0], kNorthBosToken);
  EXPECT_EQ(count(first, kNorthBosToken), 1u);
  EXPECT_EQ(std::vector<int32_t>(first.end() - 3, first.end()),
            (std::vector<int32_t>{id_of(server, "<|START_OF_TURN_TOKEN|>"), id_of(server, "<|CHATBOT_TOKEN|>"),
                                  id_of(server, "<|START_THINKING|>")}));
  EXPECT_NE(server.prompts().front().find("# Available Tools"), std::string::npos);
  const std::vector<int32_t>& second = prompts.back();
  EXPECT_EQ(count(second, id_of(server, "<|START_TOOL_RESULT|>")), 1u);
  EXPECT_EQ(count(second, id_of(server, "<|START_ACTION|>")), 1u);
  // Usage: the template's prompt in North's tokens, every generated token with the end token.
  EXPECT_EQ(loop.call["usage"]["prompt_tokens"], first.size());
  EXPECT_EQ(loop.call["usage"]["completion_tokens"], call_ids.size() + 1);
  EXPECT_EQ(loop.call["usage"]["total_tokens"], first.size() + call_ids.size() + 1);
  EXPECT_EQ(loop.answer["usage"]["prompt_tokens"], second.size());
}

// A forced call (a named function or "required") is held to the tools' schemas in cmd4's own
// form: the prompt closes the reasoning and ends with <|START_ACTION|> (one token), the model writes
// the action list under the grammar (forced_tool_call.h; the scripted tokens must pass it) and
// <|END_ACTION|>; "required" with parallel_tool_calls lets the list hold several calls.
TEST_F(NorthServer, ForcedCallsAreHeldToTheToolsSchemas) {
  ScriptedServer server(ChatFamily::kCmd4, {}, dir_);
  const std::string city = random_city(seed_);
  const std::string action = cmd4_action({city, "Lima"});
  ASSERT_TRUE(action.starts_with("<|START_ACTION|>"));
  server.on_text("Call once", "[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"" +
                            city + "\", \"days\": 3}}\n]<|END_ACTION|>");
  server.on_text("Call twice", action.substr(std::string("<|START_ACTION|>").size()));
  auto [named, named_s] = both_ways(server, {{"messages", {user("Call once")}}, {"tools", weather_tools()},
                                             {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_TRUE(server.prompts().back().ends_with("<|START_THINKING|><|END_THINKING|><|START_ACTION|>"))
      << server.prompts().back();
  EXPECT_EQ(server.prompt_ids().back().back(), id_of(server, "<|START_ACTION|>"));
  EXPECT_EQ(named["choices"][0]["finish_reason"], "tool_calls") << named.dump();
  const json& m = named["choices"][0]["message"];
  ASSERT_EQ(m.value("tool_calls", json::array()).size(), 1u) << m.dump();
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", city}, {"days", 3}}));
  EXPECT_EQ(named_s.tool_calls.size(), 1u);
  auto [both, both_s] = both_ways(server, {{"messages", {user("Call twice")}}, {"tools", weather_tools()}, {"tool_choice", "required"}});
  const json& m2 = both["choices"][0]["message"];
  ASSERT_EQ(m2.value("tool_calls", json::array()).size(), 2u) << m2.dump();
  EXPECT_EQ(json::parse(m2["tool_calls"][1]["function"]["arguments"].get<std::string>()), json({{"city", "Lima"}}));
}

// Reasoning switched off by chat_template_kwargs (`reasoning` false, `reasoning_effort` "none"):
// the prompt closes the reasoning and the reply is all answer.
TEST_F(NorthServer, ReasoningOffByTemplateKwargs) {
  ScriptedServer server(ChatFamily::kCmd4, {}, dir_);
  server.on_text("Quick", "<|START_TEXT|>Hi there.<|END_TEXT|>");
  for (const json& kwargs : {json{{"reasoning", false}}, json{{"reasoning_effort", "none"}}}) {
    auto [whole, streamed] = both_ways(server, {{"messages", {user("Quick")}}, {"chat_template_kwargs", kwargs}});
    EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hi there.") << kwargs.dump();
    EXPECT_FALSE(whole["choices"][0]["message"].contains("reasoning_content")) << kwargs.dump();
    const std::vector<int32_t> prompt = server.prompt_ids().back();
    ASSERT_GE(prompt.size(), 2u);
    EXPECT_EQ(std::vector<int32_t>(prompt.end() - 2, prompt.end()),
              (std::vector<int32_t>{id_of(server, "<|START_THINKING|>"), id_of(server, "<|END_THINKING|>")}))
        << kwargs.dump();
  }
}

// A conversation the template cannot render gets 400 naming the message; nothing reaches the model.
TEST_F(NorthServer, UnrenderableConversationsAre400NamingTheMessage) {
  ScriptedServer server(ChatFamily::kCmd4, {}, dir_);
  auto expect_400 = [&](const json& messages, const std::string& words) {
    for (const bool stream : {false, true}) {
      const auto r = post_json(server.port(), "/v1/chat/completions",
                               {{"messages", messages}, {"tools", weather_tools()}, {"stream", stream}});
      EXPECT_EQ(r.status, 400) << r.body;
      const json e = json::parse(r.body, nullptr, false);
      ASSERT_TRUE(e.contains("error")) << r.body;
      EXPECT_NE(e["error"]["message"].get<std::string>().find(words), std::string::npos) << r.body;
      EXPECT_EQ(e["error"]["param"], "messages") << r.body;
    }
  };
  // A role the template has no turn for.
  expect_400({user("hi"), {{"role", "narrator"}, {"content", "x"}}}, "message 1");
  expect_400({{{"role", "function"}, {"name", "f"}, {"content", "x"}}}, "message 0");
  // A tool result without a matching call: none at all, or another call's id.
  expect_400({user("hi"), {{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "r"}}}, "message 1 (tool)");
  const json assistant = {{"role", "assistant"},
                          {"content", nullptr},
                          {"tool_calls",
                           {{{"id", "call_a"},
                             {"type", "function"},
                             {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}};
  expect_400({user("hi"), assistant, {{"role", "tool"}, {"tool_call_id", "call_b"}, {"content", "r"}}}, "message 2 (tool)");
  EXPECT_TRUE(server.prompt_ids().empty());
  // The same conversation with the matching id renders.
  server.on_text("<|START_TOOL_RESULT|>", "ok<|END_THINKING|><|START_TEXT|>done<|END_TEXT|>");
  auto [fine, fine_s] = both_ways(server, {{"messages", {user("hi"), assistant,
                                                         {{"role", "tool"}, {"tool_call_id", "call_a"}, {"content", "r"}}}},
                                           {"tools", weather_tools()}});
  EXPECT_EQ(fine["choices"][0]["message"]["content"], "done");
}

// Malformed action blocks in the model's output come back as plain content with 200, never a 5xx,
// and so does an action cut off by max_tokens.
TEST_F(NorthServer, MalformedActionIsPlainContent) {
  ScriptedServer server(ChatFamily::kCmd4, {}, dir_);
  const std::vector<std::string> blocks = {
      "<|START_ACTION|>[{\"tool_name\": oops}]<|END_ACTION|>",
      "<|START_ACTION|>{\"tool_name\": \"get_weather\"}<|END_ACTION|>",
      "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"parameters\": {}}]<|END_ACTION|>",
      "<|START_ACTION|><|START_ACTION|>[]<|END_ACTION|>",
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string marker = "Broken " + std::to_string(i);
    server.on_text(marker, "r<|END_THINKING|>" + blocks[i]);
    auto [bad, bad_s] = both_ways(server, {{"messages", {user(marker)}}, {"tools", weather_tools()}});
    EXPECT_EQ(bad["choices"][0]["message"]["content"], blocks[i]);
    EXPECT_EQ(bad["choices"][0]["message"]["reasoning_content"], "r");
    EXPECT_FALSE(bad["choices"][0]["message"].contains("tool_calls")) << bad.dump();
    EXPECT_EQ(bad["choices"][0]["finish_reason"], "stop");
  }
  const std::string cut = "r<|END_THINKING|>" + cmd4_action({"Oslo"});
  server.on_text("Cut", cut);
  const size_t n_cut = server.encode(cut).size() - 6;
  auto [short_reply, short_s] =
      both_ways(server, {{"messages", {user("Cut")}}, {"tools", weather_tools()}, {"max_tokens", n_cut}});
  EXPECT_EQ(short_reply["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(short_reply["choices"][0]["message"].contains("tool_calls"));
  const std::string content = short_reply["choices"][0]["message"]["content"];
  EXPECT_EQ(content.rfind("<|START_ACTION|>[", 0), 0u) << content;
}

}  // namespace
}  // namespace megadecode
