// The chat-only fields of /v1/chat/completions, parsed and validated (400 naming the field):
// messages (system/developer/user/assistant/tool; text content parts; assistant tool_calls and
// reasoning_content), tools, tool_choice, parallel_tool_calls, include_reasoning,
// add_generation_prompt, continue_final_message, documents and chat_template_kwargs
// (enable_thinking, cmd4's reasoning / reasoning_effort / grounding /
// platform_instruction_override / regen_tool_call_ids; keys no supported template reads are
// ignored, as vLLM drops them). Content given as text parts keeps its parts for the templates
// that walk them (cmd4); the others read the text joined with newlines. And what a parsed request turns
// into for one model: the prompt text and how its output is parsed.
// Threading: pure functions.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "server/chat_output.h"
#include "server/request_json.h"
#include "tokenizer/chat_template.h"

namespace megadecode {

struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kFunction };
  Kind kind = Kind::kNone;
  std::string name;  // kFunction
};

struct ChatRequest {
  ChatInput input;  // messages, tools, template flags
  ToolChoice tool_choice;  // "auto" when tools are given, else "none" (OpenAI's defaults)
  bool parallel_tool_calls = true;
  bool include_reasoning = true;
};

ChatRequest parse_chat_request(const RequestJson& body);
// A `messages` array (also read by /tokenize).
std::vector<ChatMessage> parse_messages(const RequestJson& messages);

// What the served model can do with chat: its template, its tool-call format and how reasoning is
// split off its output (the template family's defaults, or the server's flags).
using ChatRenderer = std::function<std::string(const ChatInput& input)>;
struct ChatSupport {
  ChatRenderer render;      // empty when the model has no usable template
  std::string unavailable;  // why, when render is empty
  std::optional<ToolCallFormat> tool_format;
  std::optional<ReasoningFormat> reasoning_format;  // none: the output is all content
};

// The rendered conversation; ApiError 400 when the model has no template or the template refuses.
std::string render_chat(const ChatInput& input, const ChatSupport& support);

// The prompt for `chat` (rendered, plus the opening of a forced tool call) and, in *output, how
// the choices' text is parsed. ApiError 400 for what the model cannot do. hold_calls: a forced
// call's output will be held to its tools' schemas (forced_tool_call.h), so the prompt ends with
// the format's opening tag alone (held_call_opening), not with the call's name.
std::string prepare_chat(const ChatRequest& chat, const ChatSupport& support, ChatOutputOptions* output,
                         bool hold_calls = false);

}  // namespace megadecode
