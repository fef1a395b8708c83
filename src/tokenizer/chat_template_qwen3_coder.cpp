// render_qwen3_coder: the chat template of Qwen3-Coder (Qwen3-Coder-30B-A3B-Instruct,
// chat_template.jinja; the text is tests/data/qwen3_coder_chat_template.jinja), transcribed
// statement by statement:
//   - a leading system message (or, with tools, a default one) opens the system turn, followed by
//     the tools as <function><name>..<parameters><parameter>.. XML, where every schema key the
//     template does not name is rendered by its render_extra_keys macro (mappings and lists as
//     JSON, everything else with Python's str());
//   - an assistant message with tool calls renders its trimmed content, then each call as
//     <tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>;
//   - consecutive tool messages share one user turn (the first message opens none: the template
//     tests loop.previtem, which is undefined there);
//   - enable_thinking is not a variable of this template and changes nothing.
#include <initializer_list>
#include <string_view>

#include "tokenizer/chat_template_families.h"
#include "tokenizer/template_values.h"

namespace megadecode {
namespace {

namespace tv = template_values;
using Json = nlohmann::ordered_json;

constexpr std::string_view kDefaultSystem =
    "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve tasks.";
constexpr std::string_view kToolsHead = "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsTail =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

// `x is mapping or (x is sequence and x is not string)`: rendered as JSON by the template.
bool is_container(const Json& v) { return v.is_object() || v.is_array(); }

// The template's `x | string` and `x | tojson | safe` choice for one value.
std::string value_text(const Json& v) { return is_container(v) ? tv::to_json(v) : tv::to_str(v); }

// The render_extra_keys macro: every key of a mapping outside `handled`, as <key>value</key>.
void render_extra_keys(const Json* dict, std::initializer_list<std::string_view> handled, std::string& out) {
  if (dict == nullptr || !dict->is_object()) return;
  for (const auto& [key, value] : dict->items()) {
    bool skip = false;
    for (std::string_view h : handled) skip |= key == h;
    if (skip) continue;
    out += "\n<" + key + ">" + value_text(value) + "</" + key + ">";
  }
}

// dict.key in Jinja: the member when `dict` is a mapping holding it, else undefined (nullptr).
const Json* member(const Json* dict, const char* key) {
  if (dict == nullptr || !dict->is_object()) return nullptr;
  auto it = dict->find(key);
  return it == dict->end() ? nullptr : &*it;
}

void render_tool(const Json& tool, std::string& out) {
  const Json* t = member(&tool, "function") != nullptr ? member(&tool, "function") : &tool;
  const Json* name = member(t, "name");
  out += "\n<function>\n<name>" + (name ? tv::to_str(*name) : std::string()) + "</name>";
  if (const Json* d = member(t, "description")) out += "\n<description>" + std::string(tv::strip(tv::to_str(*d))) + "</description>";
  out += "\n<parameters>";
  const Json* params = member(t, "parameters");
  const Json* props = member(params, "properties");
  if (props != nullptr && props->is_object()) {
    for (const auto& [param_name, fields] : props->items()) {
      out += "\n<parameter>\n<name>" + param_name + "</name>";
      if (const Json* type = member(&fields, "type")) out += "\n<type>" + tv::to_str(*type) + "</type>";
      if (const Json* d = member(&fields, "description"))
        out += "\n<description>" + std::string(tv::strip(tv::to_str(*d))) + "</description>";
      render_extra_keys(&fields, {"name", "type", "description"}, out);
      out += "\n</parameter>";
    }
  }
  render_extra_keys(params, {"type", "properties"}, out);
  out += "\n</parameters>";
  render_extra_keys(t, {"type", "name", "description", "parameters"}, out);
  out += "\n</function>";
}

void render_tool_calls(const ChatMessage& m, std::string& out) {
  out += "<|im_start|>assistant";
  const std::string_view content = tv::strip(m.content);
  if (!content.empty()) {
    out += '\n';
    out += content;
    out += '\n';
  }
  for (const ChatToolCall& call : m.tool_calls) {
    out += "\n<tool_call>\n<function=" + call.name + ">\n";
    for (const auto& [arg, value] : call.arguments.items()) {
      out += "<parameter=" + arg + ">\n" + value_text(value) + "\n</parameter>\n";
    }
    out += "</function>\n</tool_call>";
  }
  out += "<|im_end|>\n";
}

}  // namespace

std::string render_qwen3_coder(const ChatInput& input) {
  const std::vector<ChatMessage>& messages = input.messages;
  const bool has_system = messages[0].role == "system";
  const bool has_tools = !input.tools.empty();
  const size_t first = has_system ? 1 : 0;
  std::string out;
  if (has_system) {
    out += "<|im_start|>system\n" + messages[0].content;
  } else if (has_tools) {
    out += kDefaultSystem;
  }
  if (has_tools) {
    out += kToolsHead;
    for (const Json& tool : input.tools) render_tool(tool, out);
    out += kToolsTail;
  }
  if (has_system || has_tools) out += "<|im_end|>\n";
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      render_tool_calls(m, out);
    } else if (m.role == "tool") {
      if (i > first && messages[i - 1].role != "tool") out += "<|im_start|>user\n";
      out += "<tool_response>\n" + m.content + "\n</tool_response>\n";
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {  // user, system, assistant (and the template's fallback for any other role)
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
  }
  if (input.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace megadecode
