// North Mini Code's cmd4 chat template: all of melody's rendered cmd4_hf fixtures
// (tests/data/cmd4/melody, each input preprocessed as melody does) byte for byte, by this renderer
// and by the template itself under @huggingface/jinja, hand-checked
// tool calls, merged tool results and the reasoning flags, detection by content, and the
// conversations it refuses (with the message index named).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

#include <gtest/gtest.h>

#include "chat_samples.h"
#include "core/check.h"
#include "tokenizer/chat_template.h"
#include "tokenizer_test_util.h"

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

// melody's preprocessing of its options before it renders the HF template (src/templating in
// cohere-ai/melody), done here on the fixtures' inputs: special tokens escaped in user and
// assistant text, documents and tool results; citations written into the text as
// <co>...</co: ids> (start and end are character positions; only the first insertion at one
// position is written, and positions past the end are dropped); tool names and descriptions
// JSON-escaped; tool calls numbered in order of first appearance, after the documents' call 0
// when there are documents.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); !from.empty() && at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

struct Melody {
  std::map<std::string, std::string> escapes;  // melody walks them in key order
  std::string escape(std::string text) const {
    for (const auto& [from, to] : escapes) text = replace_all(std::move(text), from, to);
    return text;
  }
  OJson escape_json(const OJson& v) const {
    if (v.is_string()) return escape(v.get<std::string>());
    if (v.is_array()) {
      OJson out = OJson::array();
      for (const OJson& x : v) out.push_back(escape_json(x));
      return out;
    }
    if (!v.is_object()) return v;
    OJson out = OJson::object();
    for (const auto& [k, x] : v.items()) out[escape(k)] = escape_json(x);
    return out;
  }
};

std::string json_escaped(const std::string& s) {
  const std::string quoted = OJson(s).dump();
  return quoted.substr(1, quoted.size() - 2);
}

std::string with_citations(const std::string& text, const OJson& citations, bool thinking_part, size_t n_parts,
                           size_t part) {
  struct Insert {
    size_t at;
    std::string text;
  };
  std::vector<Insert> inserts;
  for (const OJson& c : citations) {
    if (!(n_parts == 1 || (c.at("is_thinking") == true && part == 0) || (c.at("is_thinking") == false && part == 1)))
      continue;
    std::string ids;
    for (const OJson& source : c.at("sources")) {
      std::string results;
      for (const OJson& r : source.at("tool_result_indices")) {
        if (!results.empty()) results += ',';
        results += r.dump();
      }
      if (!ids.empty()) ids += ',';
      ids += source.at("tool_call_index").dump() + ":[" + results + "]";
    }
    inserts.push_back({c.at("start_index").get<size_t>(), "<co>"});
    inserts.push_back({c.at("end_index").get<size_t>(), "</co: " + ids + ">"});
  }
  (void)thinking_part;
  if (inserts.empty()) return text;
  for (unsigned char ch : text) MD_REQUIRE(ch < 0x80, "fixture: citations in non-ASCII text");
  std::stable_sort(inserts.begin(), inserts.end(), [](const Insert& x, const Insert& y) { return x.at < y.at; });
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (next < inserts.size() && inserts[next].at == i) {
      out += inserts[next].text;
      while (next + 1 < inserts.size() && inserts[next].at == i) ++next;
    }
    out += text[i];
  }
  if (next < inserts.size() && inserts[next].at == text.size()) out += inserts[next].text;
  return out;
}

// A tool message's content item as the result melody gives the template.
OJson tool_result_data(const OJson& item, const Melody& melody) {
  const std::string type = item.at("type").get<std::string>();
  if (type == "text") return OJson{{"content", melody.escape(item.at("text").get<std::string>())}};
  if (type == "document") return melody.escape_json(item.at("document"));
  if (type == "image") return OJson{{"image_content", item.at("image").at("template_placeholder")}};
  MD_REQUIRE(type == "multipart", "fixture: unsupported tool content ", type);
  OJson parts = OJson::array();
  for (const OJson& p : item.at("multipart")) parts.push_back(tool_result_data(p, melody));
  return parts;
}

// One of melody's render inputs (RenderCmd4Options) as the template variables melody renders
// cmd4-hf with: roles in lower case (Chatbot is assistant), content as parts (an assistant's
// first text part beside tool calls is its thinking; an image part's data is its placeholder),
// a tool message's items as document parts whose data is the result, consecutive results of
// one call merged, ids kept (regen_tool_call_ids false), a non-empty dev_instruction as a leading
// system message (its turn reads like one), grounding "enabled" unless given, json_mode and
// json_schema as response_format. An option this does not know fails the test.
ChatInput from_melody(const OJson& opts) {
  for (const auto& [key, value] : opts.items()) {
    static const std::set<std::string> kKnown = {"messages", "dev_instruction", "platform_instruction", "documents",
                                                 "available_tools", "grounding", "reasoning_type", "json_mode",
                                                 "json_schema", "additional_template_fields", "escaped_special_tokens"};
    MD_REQUIRE(kKnown.count(key) == 1, "fixture: melody option ", key, " is not supported");
  }
  Melody melody;
  const OJson escapes = opts.value("escaped_special_tokens", OJson::object());
  for (const auto& [from, to] : escapes.items()) melody.escapes[from] = to.get<std::string>();
  ChatInput in;
  in.regen_tool_call_ids = false;
  for (const OJson& doc : opts.value("documents", OJson::array())) in.documents.push_back(melody.escape_json(doc));
  // Tool-call positions: the documents' call first, then every id in order of appearance.
  std::map<std::string, size_t> position;
  const size_t first = in.documents.empty() ? 0 : 1;
  for (const OJson& m : opts.at("messages")) {
    if (m.contains("tool_call_id")) position.emplace(m["tool_call_id"].get<std::string>(), first + position.size());
    for (const OJson& call : m.value("tool_calls", OJson::array()))
      position.emplace(call.at("id").get<std::string>(), first + position.size());
  }
  const std::string dev = opts.value("dev_instruction", "");
  if (!dev.empty()) in.messages.push_back({"system", dev, {}, {}, {}});
  std::map<std::string, size_t> run;  // the current run of tool messages: call id -> message
  for (const OJson& m : opts.at("messages")) {
    ChatMessage msg;
    msg.role = lower(m.at("role").get<std::string>());
    if (msg.role == "chatbot") msg.role = "assistant";
    if (msg.role == "tool") {
      const std::string id = std::to_string(position.at(m.at("tool_call_id").get<std::string>()));
      auto [it, fresh] = run.emplace(id, in.messages.size());
      if (fresh) {
        msg.tool_call_id = id;
        msg.parts = OJson::array();
        in.messages.push_back(std::move(msg));
      }
      for (const OJson& item : m.at("content"))
        in.messages[it->second].parts.push_back({{"type", "document"}, {"document", {{"data", tool_result_data(item, melody)}}}});
      continue;
    }
    run.clear();
    const OJson& content = m.at("content");
    const OJson citations = m.value("citations", OJson::array());
    const bool calls = !m.value("tool_calls", OJson::array()).empty();
    msg.parts = OJson::array();
    for (size_t j = 0; j < content.size(); ++j) {
      const OJson& part = content[j];
      std::string type = part.at("type").get<std::string>();
      if (type == "image") {
        msg.parts.push_back({{"type", "image"}, {"data", part.at("image").at("template_placeholder")}});
        continue;
      }
      MD_REQUIRE(type == "text" || type == "thinking", "fixture: unsupported content part ", type);
      std::string text = part.at(type).get<std::string>();
      if (msg.role != "system") text = with_citations(melody.escape(text), citations, type == "thinking", content.size(), j);
      if (type == "text" && j == 0 && calls) type = "thinking";
      msg.parts.push_back({{"type", type}, {type, text}});
      if (type == "text") msg.content += (msg.content.empty() ? "" : "\n") + text;
    }
    for (const OJson& call : m.value("tool_calls", OJson::array())) {
      msg.tool_calls.push_back({std::to_string(position.at(call.at("id").get<std::string>())),
                                json_escaped(call.at("name").get<std::string>()),
                                OJson::parse(call.at("parameters").get<std::string>())});
    }
    in.messages.push_back(std::move(msg));
  }
  for (const OJson& tool : opts.value("available_tools", OJson::array())) {
    in.tools.push_back({{"type", "function"},
                        {"function",
                         {{"name", json_escaped(tool.at("name").get<std::string>())},
                          {"description", json_escaped(tool.at("description").get<std::string>())},
                          {"parameters", tool.at("parameters")}}}});
  }
  const std::string platform = opts.value("platform_instruction", "");
  if (!platform.empty()) in.platform_instruction_override = platform;
  in.grounding = opts.value("grounding", "enabled");  // melody's default
  if (opts.value("json_mode", false) || opts.contains("json_schema")) {
    in.response_format = {{"type", "json_object"}};
    if (opts.contains("json_schema")) in.response_format["schema"] = opts["json_schema"];
  }
  if (opts.contains("reasoning_type")) in.reasoning = opts["reasoning_type"] == "enabled";
  const OJson fields = opts.value("additional_template_fields", OJson::object());
  if (fields.contains("reasoning_effort")) in.reasoning_effort = fields["reasoning_effort"].get<std::string>();
  return in;
}

// Every fixture renders byte for byte (20: melody's cmd4_hf tests, all of them).
TEST(ChatTemplateCmd4, MelodyFixtures) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kData / "melody")) {
    const std::string name = entry.path().filename().string();
    const ChatInput in = from_melody(OJson::parse(read_text(entry.path() / "input.json")));
    EXPECT_EQ(cmd4().render(in), read_text(entry.path() / "output.txt")) << name;
    ++n;
  }
  EXPECT_EQ(n, 20);
}

// The same variables given to the template itself (@huggingface/jinja, as the conformance test
// runs it) render melody's outputs too: the preprocessing above is melody's, not fitted to the
// C++ renderer.
TEST(ChatTemplateCmd4, MelodyFixturesThroughTheJinjaReference) {
  OJson inputs = OJson::array();
  std::vector<std::string> names, expected;
  for (const auto& entry : fs::directory_iterator(kData / "melody")) {
    const ChatInput in = from_melody(OJson::parse(read_text(entry.path() / "input.json")));
    OJson messages = OJson::array();
    for (const ChatMessage& m : in.messages) messages.push_back(testing::message_json(m));
    OJson j = {{"template", "cmd4"}, {"messages", messages}, {"add_generation_prompt", true}, {"tools", in.tools},
               {"documents", in.documents}, {"regen_tool_call_ids", false}};
    if (in.grounding) j["grounding"] = *in.grounding;
    if (in.platform_instruction_override) j["platform_instruction_override"] = *in.platform_instruction_override;
    if (!in.response_format.is_null()) j["response_format"] = in.response_format;
    if (in.reasoning) j["reasoning"] = *in.reasoning;
    if (in.reasoning_effort) j["reasoning_effort"] = *in.reasoning_effort;
    inputs.push_back(j);
    names.push_back(entry.path().filename().string());
    expected.push_back(read_text(entry.path() / "output.txt"));
  }
  const nlohmann::json results = testing::run_node_reference("chat_template_reference.mjs", "", inputs.dump())["results"];
  ASSERT_EQ(results.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(results[i].is_string()) << names[i] << ": " << results[i].dump();
    EXPECT_EQ(results[i].get<std::string>(), expected[i]) << names[i];
  }
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
  in.tools = OJson::array();
  // Parts: each an object with a string type; a text part with a string text.
  in.messages[2].parts = OJson::parse(R"([{"type": "text", "text": "ok"}, {"type": "text"}])");
  expect_error(in, "message 2, content part 1: a text part needs a string 'text'");
  in.messages[2].parts = OJson::parse(R"([{"type": "document", "document": {"data": 1}}, "plain"])");
  expect_error(in, "message 2, content part 1: must be an object with a string 'type'");
  in.messages[2].parts = OJson::parse(R"([{"type": "document", "document": "metadata"}])");  // "data" in a string
  expect_error(in, "message 2, content part 0: the document has no \"data\" member");
  in.messages[2].parts = OJson::parse(R"([{"type": "document", "document": "text"}, {"type": "image_url"}])");
  EXPECT_NE(cmd4().render(in).find("\"0\": {\"type\": \"document\", \"document\": \"text\"},\n            \"1\": "
                                   "{\"type\": \"image_url\"}\n"),
            std::string::npos);
  in.messages[0].parts = OJson{{"not", "a list"}};
  in.messages[2].parts = nullptr;
  expect_error(in, "message 0 (user): content must be a string or a list of parts");
  in.messages[0].parts = nullptr;
  in.regen_tool_call_ids = false;  // ids kept: a result needs one
  in.messages[2].tool_call_id = "";
  expect_error(in, "message 2 (tool) has no tool_call_id");
  in.messages[2].tool_call_id = "c1";
  EXPECT_NO_THROW(cmd4().render(in));
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
