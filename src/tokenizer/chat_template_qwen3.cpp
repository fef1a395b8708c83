// render_qwen3: the chat template of Qwen3 (Qwen3-30B-A3B and the other hybrid-thinking Qwen3
// models; tokenizer_config.json "chat_template"), transcribed statement by statement:
//   - with tools: one system turn holding the first system message and the tools as JSON lines;
//   - the "last query" is the last user message that is not a wrapped <tool_response>;
//   - an assistant message takes its reasoning from reasoning_content, else splits
//     "<think>...</think>" off its content; after the last query it re-renders the reasoning in a
//     <think> block (always for the final message), earlier ones render the content only;
//   - tool calls follow as <tool_call>{"name": ..., "arguments": ...}</tool_call>;
//   - consecutive tool messages share one user turn of <tool_response> blocks;
//   - the generation prompt adds an empty think block when enable_thinking is false.
// The /think and /no_think soft switches are plain message text here: the template passes them
// to the model unchanged, and the model answers with an empty <think> block for /no_think.
#include <string_view>

#include "tokenizer/chat_template_families.h"
#include "tokenizer/template_values.h"

namespace megadecode {
namespace {

namespace tv = template_values;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t at = s.find(sep);
  return at == std::string_view::npos ? s : s.substr(0, at);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t at = s.rfind(sep);
  return at == std::string_view::npos ? s : s.substr(at + sep.size());
}

constexpr std::string_view kToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

void render_assistant(const ChatMessage& m, bool after_last_query, bool is_last, std::string& out) {
  std::string_view content = m.content, reasoning;
  if (m.reasoning_content) {
    reasoning = *m.reasoning_content;
  } else if (content.find("</think>") != std::string_view::npos) {
    content = tv::lstrip_chars(after_last(m.content, "</think>"), "\n");
    reasoning = tv::lstrip_chars(after_last(tv::rstrip_chars(before_first(m.content, "</think>"), "\n"), "<think>"), "\n");
  }
  out += "<|im_start|>assistant\n";
  if (after_last_query && (is_last || !reasoning.empty())) {
    out += "<think>\n";
    out += tv::strip_chars(reasoning, "\n");
    out += "\n</think>\n\n";
    out += tv::lstrip_chars(content, "\n");
  } else {
    out += content;
  }
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    const ChatToolCall& call = m.tool_calls[k];
    if (k > 0 || !content.empty()) out += '\n';
    out += "<tool_call>\n{\"name\": \"";
    out += call.name;
    out += "\", \"arguments\": ";
    out += call.arguments.is_string() ? call.arguments.get<std::string>() : tv::to_json(call.arguments);
    out += "}\n</tool_call>";
  }
  out += "<|im_end|>\n";
}

}  // namespace

std::string render_qwen3(const ChatInput& input) {
  const std::vector<ChatMessage>& messages = input.messages;
  const size_t n = messages.size();
  std::string out;
  if (!input.tools.empty()) {
    out += "<|im_start|>system\n";
    if (messages[0].role == "system") out += messages[0].content + "\n\n";
    out += kToolsHead;
    for (const auto& tool : input.tools) {
      out += '\n';
      out += tv::to_json(tool);
    }
    out += kToolsTail;
  } else if (messages[0].role == "system") {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  // The last user message that is not a tool response wrapped in <tool_response>.
  size_t last_query = n - 1;
  for (size_t i = n; i-- > 0;) {
    const std::string& c = messages[i].content;
    if (messages[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      render_assistant(m, i > last_query, i + 1 == n, out);
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (input.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (input.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace megadecode
