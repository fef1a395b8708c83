// Forced tool calls (tool_choice "required" or a named function) held to their tools' parameter
// schemas, in each served format. The prompt ends with the call's opening (held_call_opening), the
// output is held by forced_call_spec's grammar, then the format's closing token (one added token,
// structured::Framed) and an end token:
//   hermes (Qwen3):      "<tool_call>\n" + {"name": <a tool's name>, "arguments": <its parameters>}
//                        (at most one whitespace byte a structural gap, one before the close)
//                        + "</tool_call>": one call;
//   qwen3_coder:         "<tool_call>\n" + <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
//                        </function>\n (structured/xml_call.h) + "</tool_call>": one call;
//   cohere_command4:     "<|START_ACTION|>" + [{"tool_call_id": "...", "tool_name": <a tool's name>,
//                        "parameters": <its parameters>}, ...] (up to five whitespace bytes a gap,
//                        the template's "[\n    {") + "<|END_ACTION|>": one call, or one or more
//                        with parallel_tool_calls.
#pragma once

#include <string>
#include <vector>

#include "server/chat_request.h"
#include "server/request_json.h"
#include "server/tool_call_formats.h"
#include "structured/schema.h"

namespace megadecode {

// The end of a held call's prompt, and the added token that closes its output.
const char* held_call_opening(ToolCallFormat format);
const char* held_call_close(ToolCallFormat format);

// The tools a forced choice may call: all of them ("required") or the named one, as (index in
// `tools`, name, parameters schema; a tool without "parameters" takes any object).
struct ForcedTool {
  size_t index;
  std::string name;
  RequestJson parameters;
};
std::vector<ForcedTool> forced_tools(const ToolChoice& choice, const RequestJson& tools);

// The output's grammar over `tools` (several: any one of them, in the request's order). Each
// parameters schema is placed in the call's syntax, its local "$ref"s moved with it. parallel:
// cmd4's action list may hold more than one call.
structured::Spec forced_call_spec(ToolCallFormat format, const std::vector<ForcedTool>& tools, bool parallel);

}  // namespace megadecode
