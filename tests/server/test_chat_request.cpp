// The chat request fields cmd4's template reads beyond messages and tools: `documents`, content
// given as text parts (kept as parts: one numbered tool result per part), and the
// chat_template_kwargs grounding / platform_instruction_override / regen_tool_call_ids; their
// bad values are 400s naming the field (and the message), and the Qwen3 templates refuse
// documents.
#include <string>

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/chat_request.h"

namespace megadecode {
namespace {

using json = RequestJson;

const ChatTemplate& cmd4() {
  static const ChatTemplate t =
      ChatTemplate::from_file(std::string(MEGADECODE_SOURCE_DIR) + "/tests/data/cmd4/cmd4-hf.jinja");
  return t;
}

std::string render(const json& body, const ChatTemplate& tmpl) {
  ChatSupport support;
  support.render = [&](const ChatInput& in) { return tmpl.render(in); };
  return render_chat(parse_chat_request(body).input, support);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ChatRequest, Cmd4DocumentsPartsAndKwargs) {
  const json body = json::parse(R"({
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Read "}, {"type": "text", "text": "these."}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "search", "arguments": "{\"q\": \"x\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
    "documents": [{"title": "A", "text": "alpha"}, {"data": {"snippet": "beta"}}],
    "chat_template_kwargs": {"grounding": "enabled", "platform_instruction_override": "Be terse."}
  })");
  const ChatRequest r = parse_chat_request(body);
  ASSERT_TRUE(r.input.messages[0].parts.is_array());
  EXPECT_EQ(r.input.messages[0].content, "Read \nthese.");  // what the string-content templates read
  const std::string prompt = render(body, cmd4());
  EXPECT_TRUE(contains(prompt, "<|START_TEXT|>Be terse.\n\nNote that both your responses")) << prompt;
  EXPECT_TRUE(contains(prompt, "{\"name\": \"direct-injected-document\"")) << prompt;
  EXPECT_TRUE(contains(prompt, "<|USER_TOKEN|><|START_TEXT|>Read these.<|END_TEXT|>")) << prompt;  // parts run together
  EXPECT_TRUE(contains(prompt, "\"0\": {\"title\": \"A\", \"text\": \"alpha\"},\n            \"1\": {\"snippet\": \"beta\"}"))
      << prompt;
  // The documents take call 0; the template numbers results without them.
  EXPECT_TRUE(contains(prompt, "{\"tool_call_id\": \"1\", \"tool_name\": \"search\", \"parameters\": {\"q\": \"x\"}}")) << prompt;
  EXPECT_TRUE(contains(prompt, "\"tool_call_id\": \"0\",\n        \"results\": {\n            \"0\": {\"content\": \"first\"},\n"
                               "            \"1\": {\"content\": \"second\"}\n        },"))
      << prompt;

  json kept = body;
  kept["chat_template_kwargs"]["regen_tool_call_ids"] = false;
  const std::string with_ids = render(kept, cmd4());
  EXPECT_TRUE(contains(with_ids, "{\"tool_call_id\": \"c1\", \"tool_name\": \"search\"")) << with_ids;
  EXPECT_TRUE(contains(with_ids, "\"tool_call_id\": \"c1\",\n        \"results\"")) << with_ids;
}

void expect_400(const json& body, const std::string& param, const std::string& words, const ChatTemplate& tmpl) {
  try {
    render(body, tmpl);
    ADD_FAILURE() << "accepted: " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body.dump();
    EXPECT_EQ(e.param.value_or(""), param) << body.dump() << " -> " << e.what();
    EXPECT_TRUE(contains(e.what(), words)) << body.dump() << " -> " << e.what();
  }
}

TEST(ChatRequest, BadCmd4FieldsAre400s) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json messages = json::array({user});
  expect_400({{"messages", messages}, {"documents", "text"}}, "documents", "list of objects", cmd4());
  expect_400({{"messages", messages}, {"documents", {"text"}}}, "documents", "documents[0]", cmd4());
  expect_400({{"messages", messages}, {"chat_template_kwargs", {{"grounding", true}}}}, "chat_template_kwargs", "string", cmd4());
  expect_400({{"messages", messages}, {"chat_template_kwargs", {{"platform_instruction_override", 1}}}},
             "chat_template_kwargs", "string", cmd4());
  expect_400({{"messages", messages}, {"chat_template_kwargs", {{"regen_tool_call_ids", "no"}}}}, "chat_template_kwargs",
             "boolean", cmd4());
  // Images are not read from requests; a part of another kind names the message.
  expect_400({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", {{"url", "data:,"}}}}}}}}}},
             "messages", "message 0, content part 0: parts of type 'image_url' are not supported", cmd4());
  // Kept ids: a tool result without one names its message.
  expect_400({{"messages", {user, {{"role", "tool"}, {"content", "r"}}}}, {"chat_template_kwargs", {{"regen_tool_call_ids", false}}}},
             "messages", "message 1 (tool) has no tool_call_id", cmd4());
  // The Qwen3 templates read no documents (refused, not dropped unseen); cmd4's flags are
  // ignored there, as any other kwarg such a template does not read.
  const ChatTemplate qwen = ChatTemplate::from_file(std::string(MEGADECODE_SOURCE_DIR) + "/tests/data/qwen3_coder_chat_template.jinja");
  const std::string plain = render({{"messages", messages}}, qwen);
  expect_400({{"messages", messages}, {"documents", {{{"text", "a"}}}}}, "messages", "does not read 'documents'", qwen);
  EXPECT_EQ(render({{"messages", messages}, {"chat_template_kwargs", {{"grounding", "enabled"}, {"regen_tool_call_ids", false}}}}, qwen),
            plain);
}

}  // namespace
}  // namespace megadecode
