// Forced tool calls (tool_choice "required" or a named function) held to their tools' parameter
// schemas, in the Hermes format (Qwen3): the prompt ends with "<tool_call>\n" and the output is the
// call object {"name": <a tool's name>, "arguments": <that tool's parameters>} (at most one
// whitespace byte a structural gap, then at most one before the close), "</tool_call>" (one added
// token, structured::Framed) and an end token: one call. Other formats (Qwen3-Coder's XML
// parameters, cmd4's actions) keep the opening of the call in the prompt and free arguments.
#pragma once

#include <string>
#include <vector>

#include "server/chat_request.h"
#include "server/request_json.h"
#include "structured/schema.h"

namespace megadecode {

// The end of a forced Hermes call's prompt when its output is held to the schema.
inline constexpr const char* kHeldHermesOpening = "<tool_call>\n";

// The tools a forced choice may call: all of them ("required") or the named one, as (index in
// `tools`, name, parameters schema; a tool without "parameters" takes any object).
struct ForcedTool {
  size_t index;
  std::string name;
  RequestJson parameters;
};
std::vector<ForcedTool> forced_tools(const ToolChoice& choice, const RequestJson& tools);

// The call object's schema over `tools` (one: that call; several: anyOf, in the request's order).
// Each parameters schema is placed under the call's "arguments", its local "$ref"s moved with it.
structured::Spec forced_call_spec(const std::vector<ForcedTool>& tools);

}  // namespace megadecode
