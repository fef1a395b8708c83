// The tool-call formats of the served models, one complete block at a time:
//   hermes (Qwen3, vLLM's "hermes"):  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   qwen3_coder (Qwen3-Coder):        <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n
//                                     </function>\n</tool_call>   (the <tool_call> wrapper optional)
//   cohere_command4 (North's cmd4):   <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f",
//                                     "parameters": {...}}, ...]<|END_ACTION|>   (one or more calls;
//                                     the model's tool_call_id is dropped: the server mints ids)
// Qwen3-Coder's parameter values are text; they are typed by the tool's JSON schema (integer,
// number, boolean, object, array, nullable), as vLLM's qwen3_coder parser does. Arguments come
// back as JSON text in json.dumps' layout. Threading: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace megadecode {

enum class ToolCallFormat { kHermes, kQwen3Coder, kCohereCommand4 };

// "hermes", "qwen3_coder" or "cohere_command4" (vLLM's --tool-call-parser names; "qwen3_xml" is a
// synonym of "qwen3_coder").
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);

struct ParsedToolCall {
  std::string name;
  std::vector<std::string> argument_fragments;  // the arguments' JSON text, one piece per member
  std::string arguments() const;                // the fragments joined
};

// What opens and closes a call: each format's wrapper, and for qwen3_coder a bare <function=...>.
struct ToolCallTags {
  std::string_view open, close;
};
std::vector<ToolCallTags> tool_call_tags(ToolCallFormat format);

// The calls in the text between an opening and a closing tag (`tags` says which pair): one for
// hermes and qwen3_coder, one or more for cohere_command4. nullopt when the text is not
// well-formed. tools: the request's OpenAI tool list (for types).
std::optional<std::vector<ParsedToolCall>> parse_tool_calls(ToolCallFormat format, const ToolCallTags& tags,
                                                            std::string_view body, const nlohmann::ordered_json& tools);

// The text that starts a call in `format`, to end the prompt with when the request forces one
// (tool_choice "required": name empty; a named function: that name).
std::string tool_call_opening(ToolCallFormat format, std::string_view name);

}  // namespace megadecode
