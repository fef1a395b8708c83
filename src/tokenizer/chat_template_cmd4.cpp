// render_cmd4: the "cmd4" chat template of North Mini Code (cohere-ai/melody
// gen/templates/jinja/cmd4-hf.jinja; the text is tests/data/cmd4/cmd4-hf.jinja), transcribed for
// the variables a request gives it (messages, tools, documents, add_generation_prompt,
// response_format, and the chat_template_kwargs reasoning / reasoning_effort / grounding /
// platform_instruction_override / regen_tool_call_ids):
//   - <BOS_TOKEN>, then the platform system turn: the platform instruction (the default one, or
//     a non-empty platform_instruction_override), the grounding paragraph (grounding "enabled"
//     with tools or documents), "# Available Tools" with the direct-injected-document tool when
//     there are documents and one JSON line per tool, whose name and description the template
//     puts between quotes as they are (melody escapes them before; a request's are not), and the
//     JSON-mode instructions of a response_format (json_object, or a json_schema / schema);
//   - a leading system message becomes the developer turn, which reads like any later system turn;
//   - a turn's content is <|START_TEXT|>text<|END_TEXT|>, or, given as parts, its text parts run
//     together in one <|START_TEXT|> span until a part of another kind, an image part as its
//     "data" (or <|IMG_PATCH|>);
//   - documents come as an assistant turn calling direct-injected-document (id 0) and its result
//     turn, right after the first user message; they take the first tool-call position;
//   - an assistant turn opens <|START_THINKING|>reasoning<|END_THINKING|> (empty without
//     reasoning; a leading "thinking" part counts as reasoning), then its content, or with tool
//     calls an <|START_ACTION|> JSON list whose ids are the calls' positions in the conversation
//     (the template has no place for an assistant's content beside tool calls: it is not
//     rendered);
//   - a run of tool messages is one <|START_TOOL_RESULT|> turn; each result's id is the position
//     of the first call with its tool_call_id (not counting the documents' call: the template's
//     own numbering). A result's content is result "0" ({"content": text}, or the object as
//     given), or one numbered result per part (a text part as {"content": text}, a document
//     part's document.data, any other part as its JSON). The template renders a result that
//     answers no call with an empty id; megadecode refuses it (the model could not tell what it
//     answers). With regen_tool_call_ids false, calls and results keep their ids as given (a
//     result without one is refused).
//   - the generation prompt ends in <|START_THINKING|>, or <|START_THINKING|><|END_THINKING|>
//     when reasoning is off (reasoning: false, or reasoning_effort "none" with reasoning unset).
// The template's other melody-only variables (developer_instruction, skip_thinking,
// convert_first_system_msg, a message's tool_plan / thinking) are left undefined.
#include <algorithm>
#include <optional>
#include <string_view>

#include "core/check.h"
#include "tokenizer/chat_template_families.h"
#include "tokenizer/template_values.h"

namespace megadecode {
namespace {

namespace tv = template_values;
using Json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<BOS_TOKEN>";
constexpr std::string_view kDefaultPlatformInstruction =
    "These instructions are always to be followed and cannot be overridden by subsequent system or user turns:\n- You "
    "will answer requests for educational, informative, or creative content related to safety categories. You will not "
    "provide content that is harmful or could be used to cause harm.\n\nThese instructions serve as your defaults, but "
    "they can be overridden in subsequent system or user turns:\n- Your name is Command.\n- You are a large language "
    "model built by Cohere.";
constexpr std::string_view kGrounding =
    "Note that both your responses and reflections can be grounded. Grounding means you associate pieces of texts "
    "(called \"spans\") with those specific tool results that support them (called \"sources\"). And you use a pair of "
    "tags \"<co>\" and \"</co>\" to indicate when a span can be grounded onto a list of sources, listing them out in the "
    "closing tag. Sources from the same tool call are grouped together and listed as \"{tool_call_id}:[{list of result "
    "indices}]\", before they are joined together by \",\". E.g., \"<co>span</co: 0:[1,2],1:[0]>\" means that \"span\" "
    "is supported by result 1 and 2 from \"tool_call_id=0\" as well as result 0 from \"tool_call_id=1\".";
constexpr std::string_view kDocumentTool =
    "{\"name\": \"direct-injected-document\", \"description\": \"This is a special tool to directly inject "
    "user-uploaded documents into the chat as additional context. DO NOT use this tool by yourself!\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {}, \"required\": []}, \"responses\": {\"200\": {\"description\": "
    "\"Successfully returned a list of chunked text snippets from the directly uploaded documents.\", \"content\": "
    "{\"application/json\": {\"schema\": {\"type\": \"array\", \"items\": {\"type\": \"object\", \"required\": "
    "[\"url\", \"snippet\"], \"properties\": {\"url\": {\"type\": \"string\", \"description\": \"The url of the "
    "uploaded document.\"}, \"snippet\": {\"type\": \"string\", \"description\": \"The text snippet for the returned "
    "document chunk.\"}}}}}}}}}";
constexpr std::string_view kJsonMode =
    "When generating JSON objects, do not generate block markers. Generate an object directly without prefixing with "
    "```json. Return only the JSON and nothing else.";
constexpr std::string_view kDocumentCall =
    "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"direct-injected-document\", \"parameters\": "
    "{}}\n]<|END_ACTION|><|END_OF_TURN_TOKEN|>";
constexpr std::string_view kSystemTurn = "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>";
constexpr std::string_view kUserTurn = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>";
constexpr std::string_view kChatbotTurn = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
constexpr std::string_view kEndTurn = "<|END_OF_TURN_TOKEN|>";

// Python's truth of a template value (null: undefined or None).
bool truthy(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

// v.key: the member, or null (undefined) where v is no object or has none.
const Json& member(const Json& v, const char* key) {
  static const Json kUndefined;
  if (!v.is_object()) return kUndefined;
  auto it = v.find(key);
  return it == v.end() ? kUndefined : *it;
}

std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

// tool['function'][key]: the member, or nullptr where the template's value is undefined.
const Json* function_member(const Json& tool, const char* key) {
  auto f = tool.find("function");
  if (f == tool.end() || !f->is_object()) return nullptr;
  auto it = f->find(key);
  return it == f->end() ? nullptr : &*it;
}

// {{ value }} of a tool's name or description: a string as it is, undefined as nothing.
std::string spec_text(const Json* value) { return value == nullptr ? std::string() : tv::to_str(*value); }

// A content part's `type`, lower-cased (the template compares `type|lower`); Error for a part
// that is no object with a string type, or a text part without a string text.
std::string part_type(const Json& part, size_t message, size_t k) {
  MD_REQUIRE(part.is_object() && part.contains("type") && part["type"].is_string(), "chat: message ", message,
             ", content part ", k, ": must be an object with a string 'type'");
  std::string type = part["type"].get<std::string>();
  for (char& c : type) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  MD_REQUIRE(type != "text" || (part.contains("text") && part["text"].is_string()), "chat: message ", message,
             ", content part ", k, ": a text part needs a string 'text'");
  return type;
}

// The template's print_msg: the text, or the parts (text parts run together in one span).
void render_content(const ChatMessage& m, size_t index, std::string& out) {
  if (m.parts.is_null()) {
    out += "<|START_TEXT|>";
    out += m.content;
    out += "<|END_TEXT|>";
    return;
  }
  MD_REQUIRE(m.parts.is_array(), "chat: message ", index, " (", m.role, "): content must be a string or a list of parts");
  bool last_was_text = false;
  for (size_t k = 0; k < m.parts.size(); ++k) {
    const Json& part = m.parts[k];
    const std::string type = part_type(part, index, k);
    if (type == "text") {
      if (!last_was_text) out += "<|START_TEXT|>";
      out += part["text"].get_ref<const std::string&>();
      if (k + 1 == m.parts.size()) out += "<|END_TEXT|>";
      last_was_text = true;
    } else {
      if (last_was_text) out += "<|END_TEXT|>";
      last_was_text = false;
    }
    if (type == "image") out += truthy(member(part, "data")) ? tv::to_str(part["data"]) : "<|IMG_PATCH|>";
  }
}

void render_platform_turn(const ChatInput& input, std::string& out) {
  const bool have_tools = !input.tools.empty();
  const bool have_documents = truthy(input.documents);
  const bool grounding = input.grounding && ascii_upper(*input.grounding) == "ENABLED";
  out += kSystemTurn;
  out += "<|START_TEXT|>";
  const bool override_given = input.platform_instruction_override && !input.platform_instruction_override->empty();
  out += override_given ? std::string_view(*input.platform_instruction_override) : kDefaultPlatformInstruction;
  out += '\n';
  if (grounding && (have_tools || have_documents)) {
    out += '\n';
    out += kGrounding;
    out += '\n';
  }
  out += "\n# Available Tools\n```json\n[\n";
  if (!have_tools && !have_documents) out += '\n';
  if (have_documents) {
    out += "    ";
    out += kDocumentTool;
    out += have_tools ? ",\n" : "\n";
  }
  for (size_t i = 0; i < input.tools.size(); ++i) {
    const Json& tool = input.tools[i];
    MD_REQUIRE(tool.is_object() && tool.contains("function") && tool["function"].is_object(), "chat: tools[", i,
               "] has no 'function' object; the cmd4 template reads every tool's function");
    const Json* params = function_member(tool, "parameters");
    MD_REQUIRE(params != nullptr, "chat: tools[", i, "] ('", spec_text(function_member(tool, "name")),
               "') has no 'parameters'; the cmd4 template writes every tool's parameters as JSON");
    out += "    {\"name\": \"" + spec_text(function_member(tool, "name")) + "\", \"description\": \"" +
           spec_text(function_member(tool, "description")) + "\", \"parameters\": " + tv::to_json(*params) +
           ", \"responses\": null}";
    if (i + 1 < input.tools.size()) out += ',';
    out += '\n';
  }
  out += "]\n```";
  // response_format: json_object, or a truthy json_schema (else schema) member.
  const Json& rf = input.response_format;
  const bool json_object = truthy(rf) && member(rf, "type") == "json_object";
  const Json& schema = truthy(member(rf, "json_schema")) ? member(rf, "json_schema") : member(rf, "schema");
  if (json_object || truthy(schema)) {
    out += "\n\n";
    out += kJsonMode;
    if (truthy(schema)) out += "\nYour output should adhere to the following json schema:\n" + tv::to_str(schema);
  }
  out += "<|END_TEXT|><|END_OF_TURN_TOKEN|>";
}

// The documents as the result of the direct-injected-document call (id 0).
void render_document_turn(const Json& documents, std::string& out) {
  out += kChatbotTurn;
  out += "<|START_THINKING|>I will look through the document to address the users needs.<|END_THINKING|>";
  out += kDocumentCall;
  out += kSystemTurn;
  out += "<|START_TOOL_RESULT|>[\n    {\n        \"tool_call_id\": \"0\",\n        \"results\": {";
  for (size_t i = 0; i < documents.size(); ++i) {
    const Json& doc = documents[i];
    const Json& data = member(doc, "data");
    out += "\n            \"" + std::to_string(i) + "\": " + tv::to_json(truthy(data) ? data : doc);
    if (i + 1 < documents.size()) out += ',';
  }
  out += "\n        },\n        \"is_error\": null\n    }\n]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>";
}

// The template's tool_call_id_to_int: the position, among every tool call of the conversation,
// of the first call with this id. Error when no call has it (index: the tool message's).
size_t call_position(const std::vector<ChatMessage>& messages, size_t index) {
  const std::string& id = messages[index].tool_call_id;
  size_t position = 0;
  for (const ChatMessage& m : messages) {
    for (const ChatToolCall& call : m.tool_calls) {
      if (call.id == id) return position;
      ++position;
    }
  }
  throw Error(cat("chat: message ", index, " (tool) answers tool_call_id '", id,
                  "', which no assistant message's tool call has"));
}

// One result of a tool message's content part: text as {"content": text}, a document part's
// document.data, anything else as its JSON.
std::string tool_part_json(const Json& part, size_t index, size_t k) {
  const std::string type = part_type(part, index, k);
  if (type == "text") return tv::to_json(Json{{"content", part["text"]}});
  const Json& document = member(part, "document");
  if (type == "document" && truthy(document)) {
    // `"data" in item.document`: a member, a list element or (of a string) a substring; only an
    // object's member has a value (json.dumps of the others' Undefined fails).
    if (document.is_object() && document.contains("data")) return tv::to_json(document["data"]);
    const bool in = document.is_string() ? document.get_ref<const std::string&>().find("data") != std::string::npos
                    : document.is_array() ? std::find(document.begin(), document.end(), Json("data")) != document.end()
                                          : false;
    MD_REQUIRE(!in, "chat: message ", index, ", content part ", k, ": the document has no \"data\" member to write");
  }
  return tv::to_json(part);
}

void render_tool_result(const std::vector<ChatMessage>& messages, size_t index, bool regen_ids, std::string& out) {
  const ChatMessage& m = messages[index];
  MD_REQUIRE(regen_ids || !m.tool_call_id.empty(), "chat: message ", index, " (tool) has no tool_call_id");
  const std::string id = regen_ids ? std::to_string(call_position(messages, index)) : m.tool_call_id;
  out += "{\n        \"tool_call_id\": \"" + id + "\",\n        \"results\": {";
  if (m.parts.is_null() || m.parts.is_object()) {
    out += "\n            \"0\": " + tv::to_json(m.parts.is_null() ? Json{{"content", m.content}} : m.parts);
  } else {
    MD_REQUIRE(m.parts.is_array(), "chat: message ", index, " (tool): content must be a string, an object or a list of parts");
    for (size_t k = 0; k < m.parts.size(); ++k) {
      out += "\n            \"" + std::to_string(k) + "\": " + tool_part_json(m.parts[k], index, k);
      if (k + 1 < m.parts.size()) out += ',';
    }
  }
  out += "\n        },\n        \"is_error\": null\n    }";
}

// The reasoning an assistant turn opens with: reasoning_content, else a leading "thinking"
// part's text (the template's print_thinking); nullopt when the template finds none.
std::optional<std::string> thinking_of(const ChatMessage& m) {
  if (m.reasoning_content && !m.reasoning_content->empty()) return *m.reasoning_content;
  if (m.parts.is_array() && !m.parts.empty() && member(m.parts[0], "type") == "thinking") {
    const Json& thinking = member(m.parts[0], "thinking");
    return truthy(thinking) ? tv::to_str(thinking) : std::string();
  }
  return std::nullopt;
}

void render_assistant(const ChatMessage& m, size_t index, size_t& n_calls, bool regen_ids, std::string& out) {
  out += kChatbotTurn;
  out += "<|START_THINKING|>";
  out += thinking_of(m).value_or("");
  out += "<|END_THINKING|>";
  if (m.tool_calls.empty()) {
    render_content(m, index, out);
  } else {
    out += "<|START_ACTION|>[";
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const ChatToolCall& call = m.tool_calls[k];
      out += "\n    {\"tool_call_id\": \"" + (regen_ids ? std::to_string(n_calls) : call.id) + "\", \"tool_name\": \"" +
             call.name + "\", \"parameters\": " + tv::to_json(call.arguments) + "}";
      ++n_calls;
      if (k + 1 < m.tool_calls.size()) out += ',';
    }
    out += "\n]<|END_ACTION|>";
  }
  out += kEndTurn;
}

}  // namespace

bool cmd4_reasoning(const ChatInput& input) {
  if (input.reasoning) return *input.reasoning;
  if (!input.reasoning_effort) return true;
  std::string effort = *input.reasoning_effort;
  std::transform(effort.begin(), effort.end(), effort.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  return effort != "none";
}

std::string render_cmd4(const ChatInput& input) {
  const std::vector<ChatMessage>& messages = input.messages;
  const bool regen_ids = input.regen_tool_call_ids.value_or(true);
  MD_REQUIRE(input.documents.is_array(), "chat: documents must be a list");
  std::string out(kBos);
  render_platform_turn(input, out);
  size_t n_calls = 0;  // the template's tool_idx: tool calls so far, and the documents' call
  bool documents_sent = false;
  std::vector<std::string_view> results_seen;  // tool_call_ids of results rendered after a run's first
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      out += kSystemTurn;
      render_content(m, i, out);
      out += kEndTurn;
    } else if (m.role == "user") {
      out += kUserTurn;
      render_content(m, i, out);
      out += kEndTurn;
      if (!input.documents.empty() && !documents_sent) {
        documents_sent = true;
        ++n_calls;
        render_document_turn(input.documents, out);
      }
    } else if (m.role == "assistant") {
      render_assistant(m, i, n_calls, regen_ids, out);
    } else if (std::find(results_seen.begin(), results_seen.end(), m.tool_call_id) == results_seen.end()) {  // tool
      // A tool message opens a result turn that takes the tool messages after it; those are
      // remembered by id and skipped (a later result with one of their ids is skipped too).
      out += kSystemTurn;
      out += "<|START_TOOL_RESULT|>[\n    ";
      render_tool_result(messages, i, regen_ids, out);
      for (size_t j = i + 1; j < messages.size() && messages[j].role == "tool"; ++j) {
        out += ",\n    ";
        render_tool_result(messages, j, regen_ids, out);
        results_seen.push_back(messages[j].tool_call_id);
      }
      out += "\n]<|END_TOOL_RESULT|>";
      out += kEndTurn;
    }
  }
  if (input.add_generation_prompt) {
    out += kChatbotTurn;
    out += cmd4_reasoning(input) ? "<|START_THINKING|>" : "<|START_THINKING|><|END_THINKING|>";
  }
  return out;
}

}  // namespace megadecode
