// Chat requests for the server tests on the scripted backend: a streamed response put back
// together as OpenAI clients do, the same request sent whole and streamed, checked to agree, and
// North's tool loop through the cmd4 template, for any tokenizer behind it.
#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scripted_server.h"

namespace megadecode::testing {

using nlohmann::json;

// One choice of a streamed response, put back together the way OpenAI clients do.
struct Streamed {
  std::string role, reasoning, content, finish_reason;
  json tool_calls = json::array();  // [{id, type, function: {name, arguments}}]
  int n_reasoning_chunks = 0, n_argument_chunks = 0;
};

inline Streamed collect(const std::string& body) {
  Streamed s;
  const auto events = sse_data(body);
  EXPECT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_FALSE(chunk.contains("error")) << chunk.dump();
    for (const json& c : chunk["choices"]) {
      const json& d = c["delta"];
      if (d.contains("role")) s.role = d["role"];
      if (d.contains("reasoning_content")) {
        s.reasoning += d["reasoning_content"].get<std::string>();
        ++s.n_reasoning_chunks;
      }
      if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
      for (const json& t : d.value("tool_calls", json::array())) {
        const size_t index = t["index"];
        if (t.contains("id")) {  // a new call: id, type and name come first, arguments empty
          EXPECT_EQ(index, s.tool_calls.size());
          EXPECT_EQ(t["type"], "function");
          EXPECT_EQ(t["function"]["arguments"], "");
          s.tool_calls.push_back({{"id", t["id"]}, {"type", "function"}, {"function", {{"name", t["function"]["name"]}, {"arguments", ""}}}});
        } else {
          EXPECT_LT(index, s.tool_calls.size()) << "argument fragment before its call's name";
          if (index >= s.tool_calls.size()) continue;
          auto& args = s.tool_calls[index]["function"]["arguments"];
          args = args.get<std::string>() + t["function"]["arguments"].get<std::string>();
          ++s.n_argument_chunks;
        }
      }
      if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
    }
  }
  return s;
}

inline json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

inline json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city"]}}}])");
}

// The same request non-streamed and streamed: both must say the same thing.
inline std::pair<json, Streamed> both_ways(ScriptedServer& server, json body) {
  body["model"] = server.model();
  const auto whole = post_json(server.port(), "/v1/chat/completions", body);
  EXPECT_EQ(whole.status, 200) << whole.body;
  body["stream"] = true;
  const auto streamed = post_json(server.port(), "/v1/chat/completions", body);
  EXPECT_EQ(streamed.status, 200) << streamed.body;
  const json message = whole.json()["choices"][0]["message"];
  Streamed s = collect(streamed.body);
  EXPECT_EQ(s.role, "assistant");
  EXPECT_EQ(message["content"].is_null() ? std::string() : message["content"].get<std::string>(), s.content);
  EXPECT_EQ(message.value("reasoning_content", json()).is_null() ? std::string() : message["reasoning_content"].get<std::string>(), s.reasoning);
  EXPECT_EQ(message.value("tool_calls", json::array()).size(), s.tool_calls.size());
  for (size_t i = 0; i < s.tool_calls.size(); ++i) {
    EXPECT_EQ(message["tool_calls"][i]["function"], s.tool_calls[i]["function"]);
    EXPECT_EQ(message["tool_calls"][i]["type"], "function");
    EXPECT_EQ(message["tool_calls"][i]["id"].get<std::string>().rfind("call_", 0), 0u);
  }
  EXPECT_EQ(whole.json()["choices"][0]["finish_reason"], s.finish_reason);
  return {whole.json(), s};
}

inline std::string cmd4_action(const std::vector<std::string>& cities) {
  std::string s = "<|START_ACTION|>[";
  for (size_t i = 0; i < cities.size(); ++i)
    s += std::string(i ? "," : "") + "\n    {\"tool_call_id\": \"" + std::to_string(i) +
         "\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"" + cities[i] + "\"}}";
  return s + "\n]<|END_ACTION|>";
}

// The two exchanges of cmd4_tool_loop.
struct Cmd4Loop {
  json call, answer;
  Streamed call_streamed, answer_streamed;
};

// North's loop through the cmd4 template: reasoning and an action, the call's result sent back
// with the reasoning (interleaved thinking), and an answer with a citation, streamed and not.
// Scripts the replies for `city`, checks what holds whatever the tokenizer, returns both exchanges.
inline Cmd4Loop cmd4_tool_loop(ScriptedServer& server, const std::string& city) {
  const std::string reasoning = "The user wants the weather in " + city + ".";
  const std::string answer = "It is 18 C and sunny in " + city + ".";
  server.on_text("Weather in " + city + "?", reasoning + "<|END_THINKING|>" + cmd4_action({city}));
  server.on_text("<|START_TOOL_RESULT|>", "It is sunny.<|END_THINKING|><|START_TEXT|>It is <co>18 C and sunny</co: 0:[0]> in " +
                                              city + ".<|END_TEXT|>");
  const json request = {{"messages", {user("Weather in " + city + "?")}}, {"tools", weather_tools()}};
  Cmd4Loop loop;
  std::tie(loop.call, loop.call_streamed) = both_ways(server, request);
  const json& m = loop.call["choices"][0]["message"];
  EXPECT_EQ(loop.call["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(m["reasoning_content"], reasoning);
  EXPECT_TRUE(m["content"].is_null()) << m.dump();
  EXPECT_EQ(m.value("tool_calls", json::array()).size(), 1u) << m.dump();
  if (m.value("tool_calls", json::array()).size() != 1) return loop;
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"" + city + "\"}");
  EXPECT_GE(loop.call_streamed.n_reasoning_chunks, 2) << "reasoning streams token by token";
  EXPECT_EQ(loop.call_streamed.tool_calls.size(), 1u);
  EXPECT_TRUE(server.prompts().back().ends_with("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>"));

  json follow = request;
  follow["messages"].push_back(m);
  follow["messages"].push_back({{"role", "tool"}, {"tool_call_id", m["tool_calls"][0]["id"]}, {"content", "18 C, sunny"}});
  std::tie(loop.answer, loop.answer_streamed) = both_ways(server, follow);
  const json& a = loop.answer["choices"][0]["message"];
  EXPECT_EQ(loop.answer["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(a["reasoning_content"], "It is sunny.");
  EXPECT_EQ(a["content"], answer);
  EXPECT_FALSE(a.contains("tool_calls"));
  EXPECT_NE(server.prompts().back().find(
                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>" + reasoning + "<|END_THINKING|>" +
                cmd4_action({city}) + "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[\n"
                "    {\n        \"tool_call_id\": \"0\",\n        \"results\": {\n            \"0\": {\"content\": \"18 C, sunny\"}\n"
                "        },\n        \"is_error\": null\n    }\n]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>"),
            std::string::npos)
      << server.prompts().back();
  return loop;
}

}  // namespace megadecode::testing
