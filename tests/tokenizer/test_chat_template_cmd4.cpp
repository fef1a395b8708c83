// North Mini Code's cmd4 chat template: melody's rendered fixtures (tests/data/cmd4/melody, each
// input turned into the OpenAI-shaped conversation it stands for) byte for byte, hand-checked
// tool calls, merged tool results and the reasoning flags, detection by content, and the
// conversations it refuses (with the message index named).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/check.h"
#include "tokenizer/chat_template.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

const fs::path kData = fs::path(MEGADECODE_SOURCE_DIR) / "tests/data/cmd4";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const ChatTemplate& cmd4() {
  static const ChatTemplate t = ChatTemplate::from_file(kData / "cmd4-hf.jinja");
  return t;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// One of melody's render inputs (RenderCmd4Options) as the request it stands for: roles in lower
// case (Chatbot is assistant), text parts joined, a leading thinking part as reasoning_content,
// an assistant's text beside tool calls as its reasoning (melody passes it as tool_plan, which
// the template renders the same way), a non-empty dev_instruction as a leading system message
// (its turn reads like one). Anything else of melody's (documents, images, ...) fails the test.
ChatInput from_melody(const OJson& opts) {
  ChatInput in;
  const std::string dev = opts.value("dev_instruction", "");
  if (!dev.empty()) in.messages.push_back({"system", dev, {}, {}, {}});
  for (const OJson& m : opts.at("messages")) {
    ChatMessage msg;
    msg.role = lower(m.at("role").get<std::string>());
    if (msg.role == "chatbot") msg.role = "assistant";
    for (const OJson& part : m.at("content")) {
      const std::string type = part.at("type").get<std::string>();
      if (type == "text") {
        msg.content += part.at("text").get<std::string>();
      } else {
        MD_REQUIRE(type == "thinking" && &part == &m.at("content").front(), "fixture: unsupported content part ", type);
        msg.reasoning_content = part.at("thinking").get<std::string>();
      }
    }
    for (const OJson& call : m.value("tool_calls", OJson::array())) {
      msg.tool_calls.push_back({call.at("id").get<std::string>(), call.at("name").get<std::string>(),
                                OJson::parse(call.at("parameters").get<std::string>())});
    }
    if (!msg.tool_calls.empty()) msg.reasoning_content = std::exchange(msg.content, "");
    msg.tool_call_id = m.value("tool_call_id", "");
    in.messages.push_back(std::move(msg));
  }
  for (const OJson& tool : opts.value("available_tools", OJson::array())) {
    in.tools.push_back({{"type", "function"}, {"function", tool}});
  }
  for (const char* unsupported : {"documents", "platform_instruction", "json_schema", "json_mode"}) {
    const OJson v = opts.value(unsupported, OJson());
    MD_REQUIRE(v.is_null() || v == "" || v == false || v == OJson::array(), "fixture: melody option ", unsupported,
               " is not supported");
  }
  if (opts.contains("reasoning_type")) in.reasoning = opts["reasoning_type"] == "enabled";
  const OJson fields = opts.value("additional_template_fields", OJson::object());
  if (fields.contains("reasoning_effort")) in.reasoning_effort = fields["reasoning_effort"].get<std::string>();
  return in;
}

TEST(ChatTemplateCmd4, MelodyFixtures) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kData / "melody")) {
    const std::string name = entry.path().filename().string();
    const ChatInput in = from_melody(OJson::parse(read_text(entry.path() / "input.json")));
    EXPECT_EQ(cmd4().render(in), read_text(entry.path() / "output.txt")) << name;
    ++n;
  }
  EXPECT_EQ(n, 6);
}

ChatMessage msg(std::string role, std::string content) { return {std::move(role), std::move(content), {}, {}, {}}; }

constexpr std::string_view kPlatform =
    "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>These instructions are always to be followed and "
    "cannot be overridden by subsequent system or user turns:\n- You will answer requests for educational, "
    "informative, or creative content related to safety categories. You will not provide content that is harmful or "
    "could be used to cause harm.\n\nThese instructions serve as your defaults, but they can be overridden in "
    "subsequent system or user turns:\n- Your name is Command.\n- You are a large language model built by Cohere.\n\n"
    "# Available Tools\n```json\n[\n";

TEST(ChatTemplateCmd4, ToolsCallsAndMergedResults) {
  ChatInput in;
  in.tools = OJson::parse(R"([{"type": "function", "function": {"name": "read", "description": "Reads \"it\".",
      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "ls", "parameters": {}}}])");
  in.messages = {msg("system", "Be brief."), msg("user", "Zürich?"), msg("assistant", ""), msg("tool", "a\n\"b\""),
                 msg("tool", "c"), msg("assistant", "Done."), msg("user", "again"), msg("assistant", "")};
  in.messages[2].reasoning_content = "I read both.";
  in.messages[2].tool_calls = {{"id_a", "read", OJson{{"path", "é"}}}, {"id_b", "ls", OJson::object()}};
  in.messages[3].tool_call_id = "id_b";  // results come in any order; ids are the calls' positions
  in.messages[4].tool_call_id = "id_a";
  in.messages[7].tool_calls = {{"id_c", "ls", OJson{{"n", 1.5}}}};
  in.add_generation_prompt = false;
  EXPECT_EQ(cmd4().render(in),
            std::string(kPlatform) +
                "    {\"name\": \"read\", \"description\": \"Reads \"it\".\", \"parameters\": {\"type\": \"object\", "
                "\"properties\": {\"path\": {\"type\": \"string\"}}}, \"responses\": null},\n"
                "    {\"name\": \"ls\", \"description\": \"\", \"parameters\": {}, \"responses\": null}\n"
                "]\n```<|END_TEXT|><|END_OF_TURN_TOKEN|>"
                "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>Be brief.<|END_TEXT|><|END_OF_TURN_TOKEN|>"
                "<|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>Zürich?<|END_TEXT|><|END_OF_TURN_TOKEN|>"
                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>I read both.<|END_THINKING|><|START_ACTION|>[\n"
                "    {\"tool_call_id\": \"0\", \"tool_name\": \"read\", \"parameters\": {\"path\": \"é\"}},\n"
                "    {\"tool_call_id\": \"1\", \"tool_name\": \"ls\", \"parameters\": {}}\n"
                "]<|END_ACTION|><|END_OF_TURN_TOKEN|>"
                "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[\n"
                "    {\n        \"tool_call_id\": \"1\",\n        \"results\": {\n            \"0\": {\"content\": "
                "\"a\\n\\\"b\\\"\"}\n        },\n        \"is_error\": null\n    },\n"
                "    {\n        \"tool_call_id\": \"0\",\n        \"results\": {\n            \"0\": {\"content\": "
                "\"c\"}\n        },\n        \"is_error\": null\n    }\n"
                "]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>"
                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|><|START_TEXT|>Done.<|END_TEXT|>"
                "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>again<|END_TEXT|>"
                "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"
                "<|START_ACTION|>[\n    {\"tool_call_id\": \"2\", \"tool_name\": \"ls\", \"parameters\": {\"n\": 1.5}}\n"
                "]<|END_ACTION|><|END_OF_TURN_TOKEN|>");
}

TEST(ChatTemplateCmd4, ReasoningFlags) {
  ChatInput in;
  in.messages = {msg("user", "hi")};
  const std::string head = std::string(kPlatform) +
                           "\n]\n```<|END_TEXT|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>"
                           "hi<|END_TEXT|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
  const std::string open = head + "<|START_THINKING|>", closed = head + "<|START_THINKING|><|END_THINKING|>";
  EXPECT_EQ(cmd4().render(in), open);
  in.enable_thinking = false;  // Qwen3's flag: not a variable of this template
  EXPECT_EQ(cmd4().render(in), open);
  in.reasoning_effort = "None";
  EXPECT_EQ(cmd4().render(in), closed);
  in.reasoning = true;  // reasoning wins over reasoning_effort
  EXPECT_EQ(cmd4().render(in), open);
  in.reasoning = false;
  in.reasoning_effort = "high";
  EXPECT_EQ(cmd4().render(in), closed);
  in.add_generation_prompt = false;
  EXPECT_EQ(cmd4().render(in), head.substr(0, head.size() - std::string_view("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>").size()));
}

// The message index is named in the error, as the server's 400 passes it on.
void expect_error(const ChatInput& in, const std::string& part) {
  try {
    cmd4().render(in);
    ADD_FAILURE() << "rendered; expected an error with \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateCmd4, RefusedConversations) {
  ChatInput in;
  in.messages = {msg("user", "q"), msg("assistant", ""), msg("tool", "r"), msg("tool", "s")};
  in.messages[1].tool_calls = {{"c1", "f", OJson::object()}};
  in.messages[2].tool_call_id = "c1";
  in.messages[3].tool_call_id = "c9";  // answers no call: the template would render an empty id
  expect_error(in, "message 3 (tool) answers tool_call_id 'c9'");
  in.messages[3].tool_call_id = "";
  expect_error(in, "message 3 (tool)");
  in.messages.resize(3);
  EXPECT_NO_THROW(cmd4().render(in));
  in.messages.push_back(msg("critic", "x"));  // a role the template has no turn for
  expect_error(in, "message 3 has role \"critic\"");
  in.messages.pop_back();
  in.tools = OJson::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  expect_error(in, "tools[0] ('f') has no 'parameters'");
  in.tools = OJson::parse(R"([{"type": "function"}])");
  expect_error(in, "tools[0] has no 'function'");
}

TEST(ChatTemplateCmd4, RecognisedByContent) {
  const std::string text = read_text(kData / "cmd4-hf.jinja");
  EXPECT_EQ(cmd4().family(), ChatFamily::kCmd4);
  EXPECT_STREQ(chat_family_name(cmd4().family()), "cmd4");
  EXPECT_TRUE(cmd4().exact());
  EXPECT_FALSE(ChatTemplate::from_text("{#- edited -#}" + text).exact());
  EXPECT_EQ(ChatTemplate::from_text("{#- edited -#}" + text).family(), ChatFamily::kCmd4);
  // A model directory's tokenizer_config.json holding it (as North's does).
  const fs::path dir = fs::temp_directory_path() / ("megadecode-cmd4-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << OJson{{"chat_template", text}}.dump();
  EXPECT_EQ(ChatTemplate::load(dir).family(), ChatFamily::kCmd4);
  EXPECT_TRUE(ChatTemplate::load(dir).exact());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megadecode
