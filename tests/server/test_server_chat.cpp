// Chat as Qwen3, Qwen3-Coder and North (cmd4) users call it, over HTTP, on the scripted backend
// with the real tokenizer and templates: reasoning on and off (chat_template_kwargs), tool calls
// in all three formats (non-streaming and streaming, tags split across tokens, malformed calls),
// the call -> tool result -> answer loop, tool_choice and parallel_tool_calls, and the fields that
// are refused.
#include <gtest/gtest.h>

#include "chat_exchange.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::both_ways;
using testing::cmd4_action;
using testing::post_json;
using testing::ScriptedServer;
using testing::user;
using testing::weather_tools;

TEST(ServerChat, Qwen3ThinkingSplitsReasoning) {
  ScriptedServer server(ChatFamily::kQwen3);
  server.on_text("What is 2+2?", "<think>\nAdd two and two.\n</think>\n\n2 + 2 = 4.");
  auto [whole, streamed] = both_ways(server, {{"messages", {user("What is 2+2?")}}});
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "\nAdd two and two.\n");
  EXPECT_EQ(m["content"], "\n\n2 + 2 = 4.");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_GE(streamed.n_reasoning_chunks, 2) << "reasoning streams token by token";
  EXPECT_FALSE(m.contains("tool_calls"));
  // Thinking on is the template's default: the prompt ends with the bare generation prompt.
  EXPECT_TRUE(server.prompts().back().ends_with("<|im_start|>assistant\n"));
}

TEST(ServerChat, Qwen3ThinkingTagsSplitAcrossTokens) {
  ScriptedServer server(ChatFamily::kQwen3);
  // "<think>" and "</think>" as several byte-level tokens instead of their added tokens.
  server.on("Split tags", server.encode_pieces({"<th", "ink>", "Hmm.", "</", "think", ">", "Done."}));
  auto [whole, streamed] = both_ways(server, {{"messages", {user("Split tags")}}});
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], "Hmm.");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Done.");
}

TEST(ServerChat, Qwen3ThinkingOffSplitsNothing) {
  ScriptedServer server(ChatFamily::kQwen3);
  server.on_text("No thinking", "<think>literal</think> tags stay");
  auto [whole, streamed] =
      both_ways(server, {{"messages", {user("No thinking")}}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(m["content"], "<think>literal</think> tags stay");
  EXPECT_FALSE(m.contains("reasoning_content"));
  EXPECT_EQ(streamed.n_reasoning_chunks, 0);
  EXPECT_TRUE(server.prompts().back().ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

TEST(ServerChat, Qwen3SoftSwitchReachesTheModel) {
  ScriptedServer server(ChatFamily::kQwen3);
  // /no_think is text for the model, which answers with an empty think block.
  server.on_text("/no_think", "<think>\n\n</think>\n\nShort answer.");
  auto [whole, streamed] = both_ways(server, {{"messages", {user("Be quick /no_think")}}});
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "\n\nShort answer.");
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], "\n\n");
  EXPECT_NE(server.prompts().back().find("Be quick /no_think<|im_end|>"), std::string::npos);
}

TEST(ServerChat, Qwen3ToolCallRoundTrip) {
  ScriptedServer server(ChatFamily::kQwen3);
  server.on_text("Weather in Paris?",
                 "<think>\nI need the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                 "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>");
  server.on_text("<tool_response>", "It is sunny in Paris.");
  const json request = {{"messages", {user("Weather in Paris?")}}, {"tools", weather_tools()}};
  auto [whole, streamed] = both_ways(server, request);
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "\nI need the tool.\n");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}, {"days", 2}}));
  EXPECT_EQ(streamed.n_argument_chunks, 2) << "one argument fragment per member";
  // The tools reached the template as the client wrote them (this client sorts keys).
  EXPECT_NE(server.prompts().front().find("<tools>\n{\"function\": {\"description\": \"Weather for a city.\", \"name\": "
                                          "\"get_weather\", \"parameters\": {\"properties\""),
            std::string::npos);

  // The client runs the tool and sends the result back.
  json follow = request;
  json assistant = m;
  follow["messages"].push_back(assistant);
  follow["messages"].push_back({{"role", "tool"}, {"tool_call_id", m["tool_calls"][0]["id"]}, {"content", "sunny, 24 C"}});
  auto [answer, answer_streamed] = both_ways(server, follow);
  EXPECT_EQ(answer["choices"][0]["message"]["content"], "It is sunny in Paris.");
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "stop");
  const std::string prompt = server.prompts().back();
  EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
                        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 24 C\n</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n"),
            std::string::npos)
      << prompt;
}

TEST(ServerChat, ToolCallTagsSplitAcrossTokensAndChunks) {
  ScriptedServer server(ChatFamily::kQwen3);
  server.on("Split call", server.encode_pieces({"Checking.\n", "<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</",
                                                 "tool_", "call>"}));
  auto [whole, streamed] = both_ways(server, {{"messages", {user("Split call")}}, {"tools", weather_tools()}});
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(m["content"], "Checking.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
}

TEST(ServerChat, MalformedToolCallIsContent) {
  ScriptedServer server(ChatFamily::kQwen3);
  const std::string bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
  server.on_text("Broken call", bad);
  auto [whole, streamed] = both_ways(server, {{"messages", {user("Broken call")}}, {"tools", weather_tools()}});
  EXPECT_EQ(whole["choices"][0]["message"]["content"], bad);
  EXPECT_FALSE(whole["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  // Cut off by max_tokens in the middle of a call: the text so far, finish_reason length.
  server.on_text("Cut call", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
  auto [cut, cut_streamed] = both_ways(server, {{"messages", {user("Cut call")}}, {"tools", weather_tools()}, {"max_tokens", 5}});
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(cut["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(cut["choices"][0]["message"]["content"].get<std::string>().rfind("<tool_call>", 0), 0u);
}

TEST(ServerChat, Qwen3CoderXmlToolCalls) {
  ScriptedServer server(ChatFamily::kQwen3Coder);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "write_file", "description": "Write a file.",
      "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"},
      "mode": {"type": ["integer", "null"], "default": 420}}, "required": ["file_path", "content"]}}}])");
  server.on_text("Write hello", "I'll write it.\n<tool_call>\n<function=write_file>\n<parameter=file_path>\n/tmp/h.txt\n"
                                "</parameter>\n<parameter=content>\nhello\nworld\n</parameter>\n<parameter=mode>\n384\n"
                                "</parameter>\n</function>\n</tool_call>");
  server.on_text("<tool_response>", "Done.");
  const json request = {{"messages", {user("Write hello")}}, {"tools", tools}};
  auto [whole, streamed] = both_ways(server, request);
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(m["content"], "I'll write it.");
  EXPECT_FALSE(m.contains("reasoning_content")) << "Qwen3-Coder has no reasoning parser";
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"file_path\": \"/tmp/h.txt\", \"content\": \"hello\\nworld\", \"mode\": 384}");
  EXPECT_NE(server.prompts().front().find("<type>['integer', 'null']</type>\n<default>420</default>"), std::string::npos);

  json follow = request;
  follow["messages"].push_back(m);
  follow["messages"].push_back({{"role", "tool"}, {"tool_call_id", m["tool_calls"][0]["id"]}, {"content", "ok"}});
  auto [answer, answer_streamed] = both_ways(server, follow);
  EXPECT_EQ(answer["choices"][0]["message"]["content"], "Done.");
  EXPECT_NE(server.prompts().back().find("<|im_start|>assistant\nI'll write it.\n\n<tool_call>\n<function=write_file>\n"
                                         "<parameter=file_path>\n/tmp/h.txt\n</parameter>\n<parameter=content>\nhello\nworld\n"
                                         "</parameter>\n<parameter=mode>\n384\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                                         "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<|im_end|>\n"),
            std::string::npos)
      << server.prompts().back();
}

// A forced Qwen3-Coder call is held to its tool's schema: the prompt ends with "<tool_call>\n", the
// model writes <function=...> under the XML call's grammar (structured/xml_call.h; the scripted
// tokens must pass it), a multi-line text parameter comes back whole; a parameter the XML form
// cannot type is a 400 naming the tool and the keyword.
TEST(ServerChat, Qwen3CoderForcedCallIsHeldToItsSchema) {
  ScriptedServer server(ChatFamily::kQwen3Coder);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "write_file",
      "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"},
      "mode": {"type": ["integer", "null"]}}, "required": ["file_path", "content"]}}},
      {"type": "function", "function": {"name": "noop"}}])");
  // The parameters in the schema's order as the server got it (this client's JSON sorts its keys).
  server.on_text("Save", "<function=write_file>\n<parameter=content>\na < b\n</param>\n</parameter>\n<parameter=file_path>\n"
                         "/tmp/h.txt\n</parameter>\n<parameter=mode>\n384\n</parameter>\n</function>\n</tool_call>");
  for (const json& choice : {json({{"type", "function"}, {"function", {{"name", "write_file"}}}}), json("required")}) {
    auto [whole, streamed] = both_ways(server, {{"messages", {user("Save")}}, {"tools", tools}, {"tool_choice", choice}});
    EXPECT_TRUE(server.prompts().back().ends_with("<|im_start|>assistant\n<tool_call>\n")) << server.prompts().back();
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls") << whole.dump();
    const json& m = whole["choices"][0]["message"];
    ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "write_file");
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"],
              "{\"content\": \"a < b\\n</param>\", \"file_path\": \"/tmp/h.txt\", \"mode\": 384}");
    EXPECT_EQ(streamed.tool_calls.size(), 1u);
  }
  json bad = tools;
  bad[0]["function"]["parameters"]["properties"]["mode"] = {{"anyOf", {{{"type", "integer"}}, {{"type", "null"}}}}};
  const auto r = post_json(server.port(), "/v1/chat/completions",
                           {{"model", server.model()}, {"messages", {user("Save")}}, {"tools", bad}, {"tool_choice", "required"}});
  EXPECT_EQ(r.status, 400) << r.body;
  const json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "tools") << r.body;
  for (const char* word : {"write_file", "anyOf", "/properties/mode"})
    EXPECT_NE(e["message"].get<std::string>().find(word), std::string::npos) << word << ": " << r.body;
}

TEST(ServerChat, ToolChoiceAndParallelCalls) {
  ScriptedServer server(ChatFamily::kQwen3);
  const std::string two_calls =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\"}}\n</tool_call>";
  server.on_text("Two cities", two_calls);
  auto [both, both_s] = both_ways(server, {{"messages", {user("Two cities")}}, {"tools", weather_tools()}});
  ASSERT_EQ(both["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_NE(both["choices"][0]["message"]["tool_calls"][0]["id"], both["choices"][0]["message"]["tool_calls"][1]["id"]);
  auto [one, one_s] = both_ways(server, {{"messages", {user("Two cities")}}, {"tools", weather_tools()}, {"parallel_tool_calls", false}});
  ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u);
  // "none": the tools are still in the prompt, the output is not parsed.
  auto [none, none_s] = both_ways(server, {{"messages", {user("Two cities")}}, {"tools", weather_tools()}, {"tool_choice", "none"}});
  EXPECT_EQ(none["choices"][0]["message"]["content"], two_calls);
  EXPECT_EQ(none["choices"][0]["finish_reason"], "stop");
  // A named function: the prompt ends with the call's tag, the model writes the call object under the
  // grammar of the tool's schema (forced_tool_call.h; the scripted backend's tokens must pass it).
  server.on_text("Forced", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}\n</tool_call>");
  auto [named, named_s] = both_ways(server, {{"messages", {user("Forced")}}, {"tools", weather_tools()},
                                             {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_TRUE(server.prompts().back().ends_with(
      "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"));
  ASSERT_EQ(named["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(named["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Lima\"}");
  // "required": the same tag, any of the tools.
  server.on_text("Must call", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Quito\"}}\n</tool_call>");
  auto [req, req_s] = both_ways(server, {{"messages", {user("Must call")}}, {"tools", weather_tools()}, {"tool_choice", "required"}});
  ASSERT_EQ(req["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(req["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
}

// North's loop through the cmd4 template, its markers several Qwen3 tokens each.
TEST(ServerChat, Cmd4ToolCallRoundTrip) {
  ScriptedServer server(ChatFamily::kCmd4);
  testing::cmd4_tool_loop(server, "Paris");
}

TEST(ServerChat, Cmd4ReasoningOffSplitMarkersAndToolChoice) {
  ScriptedServer server(ChatFamily::kCmd4);
  server.on_text("Quick", "<|START_TEXT|>Hi there.<|END_TEXT|>");
  auto [quick, quick_s] = both_ways(server, {{"messages", {user("Quick")}}, {"chat_template_kwargs", {{"reasoning", false}}}});
  EXPECT_EQ(quick["choices"][0]["message"]["content"], "Hi there.");
  EXPECT_FALSE(quick["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_TRUE(server.prompts().back().ends_with("<|START_THINKING|><|END_THINKING|>"));
  // North's markers are special tokens, so cmd4 chat decodes special tokens (here Qwen3's).
  server.on_text("Specials", "<|START_TEXT|>a<|im_start|>b<|END_TEXT|>");
  auto [special, special_s] = both_ways(server, {{"messages", {user("Specials")}}, {"skip_special_tokens", true},
                                                 {"chat_template_kwargs", {{"reasoning", false}}}});
  EXPECT_EQ(special["choices"][0]["message"]["content"], "a<|im_start|>b");
  // Markers cut at odd places between tokens never leak.
  server.on("Split", server.encode_pieces({"Th", "ink.<|END_", "THINK", "ING|><|STA", "RT_TEXT|>Ans", "wer.<|END_TE", "XT|>"}));
  auto [split, split_s] = both_ways(server, {{"messages", {user("Split")}}});
  EXPECT_EQ(split["choices"][0]["message"]["reasoning_content"], "Think.");
  EXPECT_EQ(split["choices"][0]["message"]["content"], "Answer.");
  // A malformed action is plain content, never an error.
  const std::string broken = "<|START_ACTION|>[{\"tool_name\": oops}]<|END_ACTION|>";
  server.on_text("Broken", "r<|END_THINKING|>" + broken);
  auto [bad, bad_s] = both_ways(server, {{"messages", {user("Broken")}}, {"tools", weather_tools()}});
  EXPECT_EQ(bad["choices"][0]["message"]["content"], broken);
  EXPECT_EQ(bad["choices"][0]["finish_reason"], "stop");
  // parallel_tool_calls and tool_choice "none" as for Qwen3.
  server.on_text("Two cities", "r<|END_THINKING|>" + cmd4_action({"A", "B"}));
  auto [both, both_s] = both_ways(server, {{"messages", {user("Two cities")}}, {"tools", weather_tools()}});
  ASSERT_EQ(both["choices"][0]["message"]["tool_calls"].size(), 2u);
  auto [one, one_s] = both_ways(server, {{"messages", {user("Two cities")}}, {"tools", weather_tools()}, {"parallel_tool_calls", false}});
  ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u);
  auto [none, none_s] = both_ways(server, {{"messages", {user("Two cities")}}, {"tools", weather_tools()}, {"tool_choice", "none"}});
  EXPECT_EQ(none["choices"][0]["message"]["content"], cmd4_action({"A", "B"}));
  // A named function and "required": the prompt closes the reasoning and opens the action.
  server.on_text("Forced", "{\"city\": \"Lima\"}}\n]<|END_ACTION|>");
  auto [named, named_s] = both_ways(server, {{"messages", {user("Forced")}}, {"tools", weather_tools()},
                                             {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_TRUE(server.prompts().back().ends_with("<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": "
                                                "\"0\", \"tool_name\": \"get_weather\", \"parameters\": "));
  ASSERT_EQ(named["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(named["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Lima\"}");
  server.on_text("Must call", "get_weather\", \"parameters\": {\"city\": \"Quito\"}}\n]<|END_ACTION|>");
  auto [req, req_s] = both_ways(server, {{"messages", {user("Must call")}}, {"tools", weather_tools()}, {"tool_choice", "required"}});
  ASSERT_EQ(req["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(req["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Quito\"}");
}

TEST(ServerChat, ChoicesHaveTheirOwnCalls) {
  ScriptedServer server(ChatFamily::kQwen3);
  server.on_text("n=2", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}\n</tool_call>");
  const auto r = post_json(server.port(), "/v1/chat/completions",
                           {{"messages", {user("n=2")}}, {"tools", weather_tools()}, {"n", 2}, {"temperature", 1.0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_NE(j["choices"][0]["message"]["tool_calls"][0]["id"], j["choices"][1]["message"]["tool_calls"][0]["id"]);
}

TEST(ServerChat, ContinueFinalMessage) {
  ScriptedServer server(ChatFamily::kQwen3Coder);
  server.on_text("def add(a, b):", "\n    return a + b");
  const auto r = post_json(server.port(), "/v1/chat/completions",
                           {{"messages", {user("Write add."), {{"role", "assistant"}, {"content", "def add(a, b):"}}}},
                            {"add_generation_prompt", false}, {"continue_final_message", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(server.prompts().back().ends_with("<|im_start|>assistant\ndef add(a, b):"));
  EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "\n    return a + b");
}

TEST(ServerChat, ParserFlagsOverrideTheTemplate) {
  ChatFlags no_reasoning;
  no_reasoning.reasoning_parser = "none";
  ScriptedServer plain(ChatFamily::kQwen3, no_reasoning);
  plain.on_text("q", "<think>r</think>a");
  auto [whole, streamed] = both_ways(plain, {{"messages", {user("q")}}});
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "<think>r</think>a");

  ChatFlags xml;
  xml.tool_call_parser = "qwen3_coder";
  ScriptedServer coder_calls(ChatFamily::kQwen3, xml);
  coder_calls.on_text("q", "<tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n</parameter>\n</function>\n</tool_call>");
  auto [call, call_streamed] = both_ways(coder_calls, {{"messages", {user("q")}}, {"tools", weather_tools()}});
  EXPECT_EQ(call["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Bern\"}");

  ChatFlags none;
  none.tool_call_parser = "none";
  ScriptedServer no_tools(ChatFamily::kQwen3, none);
  const auto r = post_json(no_tools.port(), "/v1/chat/completions", {{"messages", {user("q")}}, {"tools", weather_tools()}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("--tool-call-parser"), std::string::npos) << r.body;

  ChatFlags bad;
  bad.tool_call_parser = "pythonic";
  EXPECT_THROW(chat_support(testing::qwen3_tokenizer_dir(), bad), Error);
  bad = ChatFlags{};
  bad.reasoning_parser = "deepseek_r1";
  EXPECT_THROW(chat_support(testing::qwen3_tokenizer_dir(), bad), Error);
  bad = ChatFlags{};
  bad.chat_template = testing::qwen3_tokenizer_dir() / "tokenizer.json";  // not a template
  EXPECT_THROW(chat_support(testing::qwen3_tokenizer_dir(), bad), Error);
  // A model directory without a template serves no chat, and says so.
  const ChatSupport missing = chat_support(std::filesystem::temp_directory_path(), ChatFlags{});
  EXPECT_FALSE(missing.render);
  EXPECT_NE(missing.unavailable.find("no chat"), std::string::npos);
}

TEST(ServerChat, RefusedFieldsSayWhich) {
  ScriptedServer server(ChatFamily::kQwen3);
  auto expect_400 = [&](json body, const std::string& param, const std::string& words) {
    body["model"] = server.model();
    if (!body.contains("messages")) body["messages"] = {user("x")};
    const auto r = post_json(server.port(), "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    const json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], param) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << r.body;
  };
  // Structured output: malformed or unenforceable specs name their field (the keyword and its JSON
  // pointer for a schema), and two forms at once are refused.
  expect_400({{"response_format", {{"type", "grammar"}}}}, "response_format", "grammar");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}, "response_format", "'schema'");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", "{}"}}}}}},
             "response_format", "object");
  expect_400({{"response_format",
               {{"type", "json_schema"},
                {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"properties", {{"a", {{"not", {{"type", "string"}}}}}}}}}}}}}},
             "response_format", "/properties/a");
  expect_400({{"structured_outputs", {{"grammar", "root ::= \"a\""}}}}, "structured_outputs", "grammar");
  expect_400({{"structured_outputs", {{"regex", "a+"}, {"choice", {"a"}}}}}, "structured_outputs", "exactly one");
  expect_400({{"structured_outputs", {{"choice", json::array()}}}}, "structured_outputs", "non-empty");
  expect_400({{"response_format", {{"type", "json_object"}}}, {"structured_outputs", {{"choice", {"a", "b"}}}}},
             "structured_outputs", "both");
  expect_400({{"guided_json", "not json"}}, "guided_json", "JSON Schema");
  expect_400({{"tools", weather_tools()}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
             "response_format", "tool_choice");
  expect_400({{"tools", {{{"type", "retrieval"}}}}}, "tools", "function");
  expect_400({{"tools", {{{"type", "function"}, {"function", {{"description", "no name"}}}}}}}, "tools", "name");
  expect_400({{"tool_choice", "auto"}}, "tool_choice", "tools");
  expect_400({{"tools", weather_tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "tool_choice", "nope");
  expect_400({{"tools", weather_tools()}, {"tool_choice", "sometimes"}}, "tool_choice", "required");
  expect_400({{"chat_template_kwargs", {{"enable_thinking", "no"}}}}, "chat_template_kwargs", "boolean");
  expect_400({{"chat_template_kwargs", {{"tools", json::array()}}}}, "chat_template_kwargs", "tools");
  expect_400({{"continue_final_message", true}}, "continue_final_message", "add_generation_prompt");
  expect_400({{"chat_template", "{{ messages }}"}}, "chat_template", "not supported");
  expect_400({{"functions", {{{"name", "f"}}}}}, "functions", "not supported");
  expect_400({{"messages", {{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {{{"type", "function"},
              {"function", {{"name", "f"}, {"arguments", "{not json"}}}}}}}}}}, "messages", "JSON object");
  expect_400({{"messages", {{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array({json::object()})}}}}}, "messages", "assistant");
  expect_400({{"echo", true}}, "echo", "chat");
  expect_400({{"use_beam_search", true}}, "use_beam_search", "not supported");
  expect_400({{"priority", 3}}, "priority", "not supported");
  // Keys no template reads are ignored, as vLLM drops them; a tool message is a message; vLLM's
  // extensions at their defaults change nothing.
  const auto ok = post_json(server.port(), "/v1/chat/completions",
                            {{"messages", {user("x"), {{"role", "tool"}, {"content", "result"}}}},
                             {"chat_template_kwargs", {{"custom_flag", 1}}}, {"max_tokens", 2},
                             {"use_beam_search", false}, {"priority", 0}, {"echo", false}, {"user", "u"}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

}  // namespace
}  // namespace megadecode
