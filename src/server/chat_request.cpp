// Chat request fields and the chat prompt (see chat_request.h).
#include "server/chat_request.h"

#include <memory>

#include "core/check.h"
#include "server/api_error.h"
#include "server/forced_tool_call.h"

namespace megadecode {
namespace {

using json = RequestJson;

// A message's text: its content, or its text parts joined with newlines (as vLLM joins them for
// string-content templates). Errors name the message.
std::string message_content(const json& m, size_t index) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  const std::string where = cat("message ", index);
  if (!it->is_array())
    throw bad_request(where + ": 'content' must be a string or a list of content parts", "messages");
  std::string text;
  bool first = true;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& part = (*it)[k];
    const std::string at = cat(where, ", content part ", k);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw bad_request(at + ": must be an object with a 'type'", "messages");
    if (part["type"] != "text")
      throw bad_request(cat(at, ": parts of type '", part["type"].get<std::string>(),
                            "' are not supported (only text parts; images are not read)"),
                        "messages");
    if (!part.contains("text") || !part["text"].is_string())
      throw bad_request(at + ": a text part needs a string 'text'", "messages");
    if (!first) text += "\n";  // vLLM joins text parts with newlines
    text += part["text"].get<std::string>();
    first = false;
  }
  return text;
}

std::optional<std::string> optional_string(const json& m, const char* name, const char* what) {
  const json* v = request_field(m, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) throw bad_request(cat(what, " '", name, "' must be a string"), "messages");
  return v->get<std::string>();
}

// An assistant message's tool_calls: OpenAI's {id, type: "function", function: {name, arguments}}
// with arguments a JSON string (parsed here, as vLLM does before rendering) or an object.
std::vector<ChatToolCall> parse_tool_calls(const json& calls, size_t message) {
  if (!calls.is_array()) throw bad_request(cat("message ", message, ": 'tool_calls' must be a list"), "messages");
  std::vector<ChatToolCall> out;
  for (const json& c : calls) {
    const std::string where = cat("message ", message, ", tool call ", out.size());
    if (!c.is_object()) throw bad_request(where + ": must be an object", "messages");
    if (const json* t = request_field(c, "type"); t != nullptr && *t != "function")
      throw bad_request(where + ": only tool calls of type 'function' are supported", "messages");
    const json* f = request_field(c, "function");
    if (f == nullptr || !f->is_object()) throw bad_request(where + ": 'function' must be an object", "messages");
    const json* name = request_field(*f, "name");
    if (name == nullptr || !name->is_string()) throw bad_request(where + ": 'function.name' must be a string", "messages");
    ChatToolCall call;
    call.id = optional_string(c, "id", "a tool call's").value_or("");
    call.name = name->get<std::string>();
    const json* args = request_field(*f, "arguments");
    if (args != nullptr && args->is_string() && !args->get_ref<const std::string&>().empty()) {
      call.arguments = json::parse(args->get<std::string>(), nullptr, false);
    } else if (args != nullptr && !args->is_string()) {
      call.arguments = *args;
    }
    if (call.arguments.is_discarded() || !call.arguments.is_object())
      throw bad_request(where + ": 'function.arguments' must be a JSON object (or its JSON text)", "messages");
    out.push_back(std::move(call));
  }
  return out;
}

json parse_tools(const json& v) {
  if (!v.is_array()) throw bad_request("'tools' must be a list of tools", "tools");
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string where = cat("tools[", i, "]");
    if (!t.is_object()) throw bad_request(where + " must be an object", "tools");
    if (const json* type = request_field(t, "type"); type == nullptr || *type != "function")
      throw bad_request(where + ": only tools of type 'function' are supported", "tools");
    const json* f = request_field(t, "function");
    if (f == nullptr || !f->is_object()) throw bad_request(where + ": 'function' must be an object", "tools");
    const json* name = request_field(*f, "name");
    if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty())
      throw bad_request(where + ": 'function.name' must be a non-empty string", "tools");
    if (const json* d = request_field(*f, "description"); d != nullptr && !d->is_string())
      throw bad_request(where + ": 'function.description' must be a string", "tools");
    if (const json* p = request_field(*f, "parameters"); p != nullptr && !p->is_object())
      throw bad_request(where + ": 'function.parameters' must be a JSON schema object", "tools");
  }
  return v;
}

ToolChoice parse_tool_choice(const json* v, const json& tools) {
  ToolChoice choice;
  choice.kind = tools.empty() ? ToolChoice::Kind::kNone : ToolChoice::Kind::kAuto;
  if (v == nullptr) return choice;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "none") return ToolChoice{ToolChoice::Kind::kNone, ""};
    if (s == "auto") choice.kind = ToolChoice::Kind::kAuto;
    else if (s == "required") choice.kind = ToolChoice::Kind::kRequired;
    else throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function", "tool_choice");
  } else if (v->is_object()) {
    const json* f = request_field(*v, "function");
    const json* name = f != nullptr && f->is_object() ? request_field(*f, "name") : nullptr;
    if (request_field(*v, "type") == nullptr || (*v)["type"] != "function" || name == nullptr || !name->is_string())
      throw bad_request("a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        "tool_choice");
    choice = ToolChoice{ToolChoice::Kind::kFunction, name->get<std::string>()};
    bool found = false;
    for (const json& t : tools) found |= t["function"]["name"] == choice.name;
    if (!found && !tools.empty())
      throw bad_request(cat("'tool_choice' names the function '", choice.name, "', which is not in 'tools'"), "tool_choice");
  } else {
    throw bad_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (tools.empty()) throw bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice");
  return choice;
}

// chat_template_kwargs: enable_thinking (Qwen3), reasoning, reasoning_effort, grounding,
// platform_instruction_override and regen_tool_call_ids (cmd4) are the variables the supported
// templates read beyond the request's own fields; those may not be set here, everything else no
// template reads (cmd4's are ignored by the other templates, as vLLM's templates ignore them).
void parse_template_kwargs(const json& kwargs, ChatInput& input) {
  if (!kwargs.is_object()) throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "enable_thinking" || key == "reasoning") {
      if (!value.is_boolean())
        throw bad_request(cat("'chat_template_kwargs.", key, "' must be a boolean"), "chat_template_kwargs");
      (key == "reasoning" ? input.reasoning : input.enable_thinking) = value.get<bool>();
    } else if (key == "reasoning_effort") {
      if (!value.is_string())
        throw bad_request("'chat_template_kwargs.reasoning_effort' must be a string", "chat_template_kwargs");
      input.reasoning_effort = value.get<std::string>();
    } else if (key == "grounding" || key == "platform_instruction_override") {
      if (!value.is_string())
        throw bad_request(cat("'chat_template_kwargs.", key, "' must be a string"), "chat_template_kwargs");
      (key == "grounding" ? input.grounding : input.platform_instruction_override) = value.get<std::string>();
    } else if (key == "regen_tool_call_ids") {
      if (!value.is_boolean())
        throw bad_request("'chat_template_kwargs.regen_tool_call_ids' must be a boolean", "chat_template_kwargs");
      input.regen_tool_call_ids = value.get<bool>();
    } else if (key == "tools" || key == "messages" || key == "add_generation_prompt" || key == "continue_final_message" ||
               key == "documents" || key == "chat_template" || key == "tokenize") {
      throw bad_request(cat("'chat_template_kwargs.", key, "' is not supported: use the request field of that name"),
                        "chat_template_kwargs");
    }
  }
}

}  // namespace

std::vector<ChatMessage> parse_messages(const json& v) {
  if (!v.is_array()) throw bad_request("'messages' must be a list of messages", "messages");
  if (v.empty()) throw bad_request("'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (const json& m : v) {
    if (!m.is_object()) throw bad_request(cat("message ", out.size(), " must be an object"), "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw bad_request(cat("message ", out.size(), " needs a string 'role'"), "messages");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for system instructions
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      throw bad_request(cat("message ", out.size(), ": role '", msg.role,
                            "' is not supported (system, developer, user, assistant, tool)"),
                        "messages");
    msg.content = message_content(m, out.size());
    if (const json* c = request_field(m, "content"); c != nullptr && c->is_array()) msg.parts = *c;  // cmd4 reads them
    if (msg.role == "assistant") {
      msg.reasoning_content = optional_string(m, "reasoning_content", "an assistant message's");
      if (!msg.reasoning_content) msg.reasoning_content = optional_string(m, "reasoning", "an assistant message's");
      if (const json* calls = request_field(m, "tool_calls")) msg.tool_calls = parse_tool_calls(*calls, out.size());
    } else if (request_field(m, "tool_calls") != nullptr) {
      throw bad_request(cat("message ", out.size(), " (", msg.role, ") has 'tool_calls'; only assistant messages do"),
                        "messages");
    }
    if (msg.role == "tool") msg.tool_call_id = optional_string(m, "tool_call_id", "a tool message's").value_or("");
    out.push_back(std::move(msg));
  }
  return out;
}

ChatRequest parse_chat_request(const json& body) {
  ChatRequest r;
  const json* m = request_field(body, "messages");
  if (m == nullptr) throw bad_request("'messages' is required", "messages");
  r.input.messages = parse_messages(*m);
  if (const json* t = request_field(body, "tools")) r.input.tools = parse_tools(*t);
  r.tool_choice = parse_tool_choice(request_field(body, "tool_choice"), r.input.tools);
  r.parallel_tool_calls = request_bool(body, "parallel_tool_calls").value_or(true);
  r.include_reasoning = request_bool(body, "include_reasoning").value_or(true);
  r.input.add_generation_prompt = request_bool(body, "add_generation_prompt").value_or(true);
  r.input.continue_final_message = request_bool(body, "continue_final_message").value_or(false);
  if (r.input.add_generation_prompt && r.input.continue_final_message)
    throw bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                      "continue_final_message");
  if (const json* k = request_field(body, "chat_template_kwargs")) parse_template_kwargs(*k, r.input);
  // vLLM's `documents` (passed to the template; cmd4 injects them as a tool result).
  if (const json* d = request_field(body, "documents")) {
    if (!d->is_array()) throw bad_request("'documents' must be a list of objects", "documents");
    for (size_t i = 0; i < d->size(); ++i)
      if (!(*d)[i].is_object()) throw bad_request(cat("documents[", i, "] must be an object"), "documents");
    r.input.documents = *d;
  }
  return r;
}

std::string render_chat(const ChatInput& input, const ChatSupport& support) {
  if (!support.render) throw bad_request(support.unavailable, "messages");
  try {
    return support.render(input);
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
}

std::string prepare_chat(const ChatRequest& chat, const ChatSupport& support, ChatOutputOptions* output,
                         bool hold_calls) {
  const bool calls_wanted = chat.tool_choice.kind != ToolChoice::Kind::kNone;
  if (calls_wanted && !support.tool_format)
    throw bad_request("this server parses no tool calls for this model (start it with --tool-call-parser)",
                      "tool_choice");
  const bool forced = chat.tool_choice.kind == ToolChoice::Kind::kRequired ||
                      chat.tool_choice.kind == ToolChoice::Kind::kFunction;
  if (forced && !chat.input.add_generation_prompt)
    throw bad_request("a required or named 'tool_choice' needs add_generation_prompt", "tool_choice");
  std::string prompt = render_chat(chat.input, support);
  *output = ChatOutputOptions{};
  // The model thinks unless the template switched it off (Qwen3's enable_thinking, cmd4's
  // reasoning and reasoning_effort), or a forced call skips it (below). cmd4's output is in its
  // reasoning only after a generation prompt (a continued message goes on in its text).
  const bool cmd4 = support.reasoning_format == ReasoningFormat::kCohereCommand4 ||
                    support.tool_format == ToolCallFormat::kCohereCommand4;
  const bool thinking =
      cmd4 ? chat.input.add_generation_prompt && cmd4_reasoning(chat.input) : chat.input.enable_thinking != false;
  if (support.reasoning_format) output->reasoning_format = *support.reasoning_format;
  output->reasoning = support.reasoning_format && thinking;
  output->include_reasoning = chat.include_reasoning;
  if (calls_wanted) {
    output->tool_format = support.tool_format;
    output->tools = std::make_shared<const RequestJson>(chat.input.tools);
    output->parallel_tool_calls = chat.parallel_tool_calls;
  }
  if (forced) {
    // A forced call is the prompt ending with its opening (after an empty think block, as the
    // template writes one when thinking is off; cmd4's prompt always opens one, which is closed);
    // a held call opens only the tag, and its grammar writes the rest.
    if (cmd4 && thinking) prompt += "<|END_THINKING|>";
    if (!cmd4 && output->reasoning) prompt += "<think>\n\n</think>\n\n";
    output->reasoning = false;
    output->primed = hold_calls ? std::string(held_call_opening(*support.tool_format))
                                : tool_call_opening(*support.tool_format, chat.tool_choice.name);
    prompt += output->primed;
  }
  return prompt;
}

}  // namespace megadecode
