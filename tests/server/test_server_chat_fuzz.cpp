// sanitize: address
// Fuzz of chat with tools and reasoning on the scripted Qwen3, Qwen3-Coder and cmd4 servers: random
// conversations (tool calls, tool results, reasoning, odd role orders), tool lists, tool_choice,
// parallel_tool_calls and thinking flags, some fields mutated to wrong types, answered by random
// replies built from the formats' tags, JSON fragments, text and raw token ids. Every response
// must be a 200 or a 400, well-formed (a stream ends with [DONE] and carries no error), and
// every returned tool call must have a name and JSON-object arguments.
#include <gtest/gtest.h>

#include "../tokenizer/chat_samples.h"
#include "scripted_server.h"

namespace megadecode {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr int kRequestsPerFamily = 300;

// A reply: mostly the family's own shape (reasoning, text, calls) with a piece dropped, doubled
// or cut in two now and then; otherwise tags, fragments, text and raw token ids in any order.
std::vector<int32_t> random_reply(SplitMix64& rng, const testing::ScriptedServer& server, ChatFamily family) {
  static const char* kPieces[] = {
      "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "\n\n", "{\"name\": \"get_weather\", \"arguments\": ",
      "{\"city\": \"Zürich\"}}", "}", "{", "\"", "<function=get_weather>", "<function=", "<parameter=city>",
      "</parameter>", "</function>", "Paris", " and ", "数据 ", "🙂", "null", "[1, 2]", "<tool_response>", "<",
      "<|START_THINKING|>", "<|END_THINKING|>", "<|START_TEXT|>", "<|END_TEXT|>", "<|START_ACTION|>", "<|END_ACTION|>",
      "[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": ", "]", "<co>", "</co: 0:[1]>"};
  std::vector<std::string> pieces;
  if (rng.below(2) == 0) {
    if (family == ChatFamily::kCmd4) {
      pieces = {"The weather tool.", "<|END_THINKING|>"};
      if (rng.below(2) == 0) {
        for (const char* p : {"<|START_TEXT|>", "It is <co>sunny</co: 0:[0]>.", "<|END_TEXT|>"}) pieces.push_back(p);
      } else {
        pieces.push_back("<|START_ACTION|>[");
        for (int k = 1 + static_cast<int>(rng.below(2)); k > 0; --k)
          pieces.push_back(std::string(k == 1 ? "" : ",") +
                           "\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
        pieces.push_back("\n]<|END_ACTION|>");
      }
    } else if (family == ChatFamily::kQwen3) {
      pieces = {"<think>", "\nThe weather tool.\n", "</think>", "\n\n"};
      for (int k = 1 + static_cast<int>(rng.below(2)); k > 0; --k)
        for (const char* p : {"<tool_call>", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n", "</tool_call>"})
          pieces.push_back(p);
    } else {
      pieces = {"Let me check.\n"};
      for (int k = 1 + static_cast<int>(rng.below(2)); k > 0; --k)
        for (const char* p : {"<tool_call>", "\n<function=get_weather>\n", "<parameter=city>\nOslo\n</parameter>\n",
                              "</function>\n", "</tool_call>"})
          pieces.push_back(p);
    }
    for (int k = static_cast<int>(rng.below(3)); k > 0; --k) {
      const size_t at = rng.below(pieces.size());
      switch (rng.below(4)) {
        case 0: pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(at)); break;
        case 1: pieces.insert(pieces.begin() + static_cast<std::ptrdiff_t>(at), pieces[at]); break;
        case 2: pieces.insert(pieces.begin() + static_cast<std::ptrdiff_t>(at), kPieces[rng.below(std::size(kPieces))]); break;
        default: {  // cut a piece in two: its tag reaches the server as several tokens
          const std::string p = pieces[at];
          size_t cut = rng.below(p.size() + 1);
          // at a character boundary: the text is encoded, and encoding refuses half a character
          // (raw token ids below already send the server partial characters)
          while (cut < p.size() && (static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) --cut;
          pieces[at] = p.substr(0, cut);
          pieces.insert(pieces.begin() + static_cast<std::ptrdiff_t>(at) + 1, p.substr(cut));
        }
      }
      if (pieces.empty()) break;
    }
    return server.encode_pieces(pieces);
  }
  std::vector<int32_t> out;
  for (int i = static_cast<int>(rng.below(24)); i > 0; --i) {
    if (rng.below(8) == 0) {
      out.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(server.tokenizer().vocab_size()))));
    } else {
      for (int32_t t : server.encode(kPieces[rng.below(std::size(kPieces))])) out.push_back(t);
    }
  }
  return out;
}

json random_request(SplitMix64& rng, testing::ChatSampler& sampler, const std::string& marker, ChatFamily family) {
  ChatInput in = sampler.conversation();
  in.messages.push_back(ChatMessage{"user", marker, {}, {}, {}});
  json body;
  json messages = json::array();
  for (const ChatMessage& m : in.messages) messages.push_back(json::parse(testing::message_json(m).dump()));
  body["messages"] = messages;
  if (!in.tools.empty() || rng.below(4) == 0) {
    json tools = json::parse(in.tools.dump());
    tools.push_back(json::parse(R"({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}})"));
    body["tools"] = tools;
    switch (rng.below(6)) {
      case 0: body["tool_choice"] = "none"; break;
      case 1: body["tool_choice"] = "required"; break;
      case 2: body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}}; break;
      case 3: body["tool_choice"] = "auto"; break;
      default: break;
    }
    if (rng.below(3) == 0) body["parallel_tool_calls"] = rng.below(2) == 0;
  }
  if (in.enable_thinking) body["chat_template_kwargs"]["enable_thinking"] = *in.enable_thinking;
  if (in.reasoning) body["chat_template_kwargs"]["reasoning"] = *in.reasoning;
  if (!in.add_generation_prompt) body["add_generation_prompt"] = false;
  if (in.continue_final_message) body["continue_final_message"] = true;
  body["max_tokens"] = 1 + rng.below(family == ChatFamily::kCmd4 ? 120 : 40);  // cmd4's markers are several tokens here
  if (rng.below(3) == 0) body["n"] = 1 + rng.below(2);
  if (rng.below(2) == 0) body["stream"] = true;
  if (rng.below(4) == 0) body["include_reasoning"] = rng.below(2) == 0;
  if (rng.below(6) == 0) {  // one field of the wrong type
    static const char* kFields[] = {"tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "messages",
                                    "continue_final_message", "include_reasoning"};
    static const json kValues[] = {nullptr, 7, "x", json::array({1}), json::object({{"a", 1}}), true};
    body[kFields[rng.below(std::size(kFields))]] = kValues[rng.below(std::size(kValues))];
  }
  return body;
}

// "" when the response is one the request may get, else what is wrong.
std::string check_response(const testing::HttpResult& r) {
  if (r.status == 400) return json::parse(r.body, nullptr, false).contains("error") ? "" : "400 without an error body";
  if (r.status != 200) return "status " + std::to_string(r.status) + ": " + r.body;
  auto check_calls = [](const json& calls) -> std::string {
    for (const json& c : calls) {
      const json* args = c.contains("function") ? &c["function"] : nullptr;
      if (args == nullptr || !args->contains("name") || !(*args)["name"].is_string()) return "a tool call without a name";
      const json parsed = json::parse((*args)["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_object()) return "tool call arguments that are not a JSON object";
    }
    return "";
  };
  if (r.headers.count("Content-Type") && r.headers.at("Content-Type") == "text/event-stream") {
    const auto events = testing::sse_data(r.body);
    if (events.empty() || events.back() != "[DONE]") return "stream without [DONE]";
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      const json e = json::parse(events[i], nullptr, false);
      if (e.is_discarded() || e.contains("error")) return "bad stream event: " + events[i];
    }
    return "";
  }
  const json out = json::parse(r.body, nullptr, false);
  if (out.is_discarded() || !out.contains("choices")) return "200 without choices";
  for (const json& c : out["choices"]) {
    const json& m = c["message"];
    if (!m["content"].is_null() && !m["content"].is_string()) return "content neither text nor null";
    if (std::string why = check_calls(m.value("tool_calls", json::array())); !why.empty()) return why;
    const std::string finish = c["finish_reason"];
    if (finish != "stop" && finish != "length" && finish != "tool_calls") return "finish_reason " + finish;
    if ((finish == "tool_calls") != m.contains("tool_calls")) return "finish_reason and tool_calls disagree";
  }
  return "";
}

void fuzz(ChatFamily family) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  testing::ChatSampler sampler(mix64(seed));
  testing::ScriptedServer server(family);
  testing::HttpClient client(server.port());
  int ok = 0, refused = 0, failures = 0, with_calls = 0, with_reasoning = 0;
  for (int i = 0; i < kRequestsPerFamily; ++i) {
    const std::string marker = "FUZZ-" + std::to_string(i) + "-END";
    server.on(marker, random_reply(rng, server, family));
    const json body = random_request(rng, sampler, marker, family);
    const testing::HttpResult r = client.request("POST", "/v1/chat/completions", body.dump(-1, ' ', false, json::error_handler_t::replace));
    (r.status == 200 ? ok : refused) += 1;
    with_calls += r.status == 200 && r.body.find("\"tool_calls\":[{") != std::string::npos;
    with_reasoning += r.status == 200 && r.body.find("\"reasoning_content\":\"") != std::string::npos;
    if (const std::string why = check_response(r); !why.empty() && ++failures <= 5)
      ADD_FAILURE() << "request " << i << ": " << why << "\n  request: " << body.dump().substr(0, 800);
  }
  std::printf("%s: %d answered (%d with tool calls, %d with reasoning), %d refused, %d bad\n", chat_family_name(family), ok,
              with_calls, with_reasoning, refused, failures);
  // cmd4's template refuses more (tools without parameters, results that answer no call).
  EXPECT_GT(ok, family == ChatFamily::kCmd4 ? kRequestsPerFamily * 2 / 5 : kRequestsPerFamily / 2);
}

TEST(ServerChatFuzz, Qwen3) { fuzz(ChatFamily::kQwen3); }
TEST(ServerChatFuzz, Qwen3Coder) { fuzz(ChatFamily::kQwen3Coder); }
TEST(ServerChatFuzz, Cmd4) { fuzz(ChatFamily::kCmd4); }

}  // namespace
}  // namespace megadecode
