// render_cmd4: the "cmd4" chat template of North Mini Code (cohere-ai/melody
// gen/templates/jinja/cmd4-hf.jinja; the text is tests/data/cmd4/cmd4-hf.jinja), transcribed for
// the variables an OpenAI request gives it (messages, tools, add_generation_prompt, and the
// chat_template_kwargs reasoning / reasoning_effort):
//   - <BOS_TOKEN>, then the platform system turn: the default platform instruction and
//     "# Available Tools" with one JSON line per tool, whose name and description the template
//     puts between quotes as they are (melody escapes them before; a request's are not);
//   - a leading system message becomes the developer turn, which reads like any later system turn;
//   - an assistant turn opens <|START_THINKING|>reasoning<|END_THINKING|> (empty without
//     reasoning), then <|START_TEXT|>content<|END_TEXT|>, or with tool calls an
//     <|START_ACTION|> JSON list whose ids are the calls' positions in the conversation (the
//     template has no place for an assistant's content beside tool calls: it is not rendered);
//   - a run of tool messages is one <|START_TOOL_RESULT|> turn; each result's id is the position
//     of the first call with its tool_call_id. The template renders a result that answers no call
//     with an empty id; megadecode refuses it (the model could not tell what it answers).
//   - the generation prompt ends in <|START_THINKING|>, or <|START_THINKING|><|END_THINKING|>
//     when reasoning is off (reasoning: false, or reasoning_effort "none" with reasoning unset).
// The template's melody-only variables (documents, grounding, response_format,
// platform_instruction_override, developer_instruction, skip_thinking, ...) are left undefined.
#include <algorithm>
#include <string_view>

#include "core/check.h"
#include "tokenizer/chat_template_families.h"
#include "tokenizer/template_values.h"

namespace megadecode {
namespace {

namespace tv = template_values;
using Json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<BOS_TOKEN>";
constexpr std::string_view kPlatformTurn =
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>These instructions are always to be followed and cannot be "
    "overridden by subsequent system or user turns:\n- You will answer requests for educational, informative, or "
    "creative content related to safety categories. You will not provide content that is harmful or could be used to "
    "cause harm.\n\nThese instructions serve as your defaults, but they can be overridden in subsequent system or user "
    "turns:\n- Your name is Command.\n- You are a large language model built by Cohere.\n\n# Available Tools\n```json\n[\n";
constexpr std::string_view kPlatformTurnEnd = "]\n```<|END_TEXT|><|END_OF_TURN_TOKEN|>";
constexpr std::string_view kSystemTurn = "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>";
constexpr std::string_view kUserTurn = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>";
constexpr std::string_view kChatbotTurn = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
constexpr std::string_view kEndTurn = "<|END_OF_TURN_TOKEN|>";

// tool['function'][key]: the member, or nullptr where the template's value is undefined.
const Json* function_member(const Json& tool, const char* key) {
  auto f = tool.find("function");
  if (f == tool.end() || !f->is_object()) return nullptr;
  auto it = f->find(key);
  return it == f->end() ? nullptr : &*it;
}

// {{ value }} of a tool's name or description: a string as it is, undefined as nothing.
std::string spec_text(const Json* value) { return value == nullptr ? std::string() : tv::to_str(*value); }

void render_tools(const Json& tools, std::string& out) {
  out += kPlatformTurn;
  if (tools.empty()) out += '\n';
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    MD_REQUIRE(tool.is_object() && tool.contains("function") && tool["function"].is_object(), "chat: tools[", i,
               "] has no 'function' object; the cmd4 template reads every tool's function");
    const Json* params = function_member(tool, "parameters");
    MD_REQUIRE(params != nullptr, "chat: tools[", i, "] ('", spec_text(function_member(tool, "name")),
               "') has no 'parameters'; the cmd4 template writes every tool's parameters as JSON");
    out += "    {\"name\": \"" + spec_text(function_member(tool, "name")) + "\", \"description\": \"" +
           spec_text(function_member(tool, "description")) + "\", \"parameters\": " + tv::to_json(*params) +
           ", \"responses\": null}";
    if (i + 1 < tools.size()) out += ',';
    out += '\n';
  }
  out += kPlatformTurnEnd;
}

void append_text(std::string_view text, std::string& out) {
  out += "<|START_TEXT|>";
  out += text;
  out += "<|END_TEXT|>";
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

void render_tool_result(const std::vector<ChatMessage>& messages, size_t index, std::string& out) {
  out += "{\n        \"tool_call_id\": \"" + std::to_string(call_position(messages, index)) +
         "\",\n        \"results\": {\n            \"0\": " + tv::to_json(Json{{"content", messages[index].content}}) +
         "\n        },\n        \"is_error\": null\n    }";
}

void render_assistant(const ChatMessage& m, size_t& n_calls, std::string& out) {
  out += kChatbotTurn;
  out += "<|START_THINKING|>";
  if (m.reasoning_content) out += *m.reasoning_content;
  out += "<|END_THINKING|>";
  if (m.tool_calls.empty()) {
    append_text(m.content, out);
  } else {
    out += "<|START_ACTION|>[";
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const ChatToolCall& call = m.tool_calls[k];
      out += "\n    {\"tool_call_id\": \"" + std::to_string(n_calls++) + "\", \"tool_name\": \"" + call.name +
             "\", \"parameters\": " + tv::to_json(call.arguments) + "}";
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
  std::string out(kBos);
  render_tools(input.tools, out);
  size_t n_calls = 0;
  std::vector<std::string_view> results_seen;  // tool_call_ids of results rendered after a run's first
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      out += kSystemTurn;
      append_text(m.content, out);
      out += kEndTurn;
    } else if (m.role == "user") {
      out += kUserTurn;
      append_text(m.content, out);
      out += kEndTurn;
    } else if (m.role == "assistant") {
      render_assistant(m, n_calls, out);
    } else if (std::find(results_seen.begin(), results_seen.end(), m.tool_call_id) == results_seen.end()) {  // tool
      // A tool message opens a result turn that takes the tool messages after it; those are
      // remembered by id and skipped (a later result with one of their ids is skipped too).
      out += kSystemTurn;
      out += "<|START_TOOL_RESULT|>[\n    ";
      render_tool_result(messages, i, out);
      for (size_t j = i + 1; j < messages.size() && messages[j].role == "tool"; ++j) {
        out += ",\n    ";
        render_tool_result(messages, j, out);
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
