// The chat template of a model: the conversation (system/user/assistant/tool messages, tool calls,
// reasoning, the tools block, enable_thinking) rendered into the prompt text exactly as the
// model's own Jinja template renders it under Python's jinja2. Three families are implemented, each
// written out by hand in C++ (chat_template_qwen3.cpp, chat_template_qwen3_coder.cpp,
// chat_template_cmd4.cpp): Qwen3 (JSON tool calls, <think> reasoning), Qwen3-Coder (XML tool
// calls) and cmd4, North Mini Code's (<|START_ACTION|> JSON tool calls, <|START_THINKING|>
// reasoning). Any other template is refused with an Error. Thread-safety: a ChatTemplate is
// immutable; render() may run anywhere.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace megadecode {

struct ChatToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // a JSON object
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant: the reasoning, when given apart
  std::vector<ChatToolCall> tool_calls;          // assistant
  std::string tool_call_id;                      // tool (cmd4 renders it, as a position or as is)
  // The content as the request gave it when that was a list of parts (or, for a tool result of
  // cmd4's, a JSON object); null when it was a string. `content` holds the parts' text joined
  // with newlines (what the string-content templates read); cmd4 reads the parts themselves, as
  // its template walks them: text and image parts of a turn, one numbered result per part of a
  // tool result (text, document and anything else as its JSON).
  nlohmann::ordered_json parts;
};

// What a template is rendered with (the variables transformers' apply_chat_template passes).
struct ChatInput {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI tool objects, as sent
  bool add_generation_prompt = true;
  // Ends the prompt inside the final message, so that generation continues it (transformers'
  // rule: cut the rendering right after the final message's text).
  bool continue_final_message = false;
  std::optional<bool> enable_thinking;  // chat_template_kwargs; unset is the template's default
  // chat_template_kwargs of cmd4: `reasoning`, and `reasoning_effort`, whose "none" (any case)
  // switches reasoning off when `reasoning` is unset. The other families ignore them.
  std::optional<bool> reasoning;
  std::optional<std::string> reasoning_effort;
  // cmd4 only (the other families refuse documents and response_format, and ignore the flags):
  // `documents` (the request field vLLM
  // passes to templates: a list of objects, each rendered as its JSON, or its "data" member when
  // that is truthy), and the chat_template_kwargs `grounding` ("enabled" in any case turns on
  // the grounding paragraph when there are tools or documents), `platform_instruction_override`
  // (replaces the default platform instruction when non-empty) and `regen_tool_call_ids` (false:
  // tool calls and results keep their ids instead of positions). response_format (json_object,
  // or a json_schema / schema member) adds the JSON-mode instructions to the platform turn.
  nlohmann::ordered_json documents = nlohmann::ordered_json::array();
  std::optional<std::string> grounding;
  std::optional<std::string> platform_instruction_override;
  std::optional<bool> regen_tool_call_ids;
  nlohmann::ordered_json response_format;  // null: none
};

enum class ChatFamily { kQwen3, kQwen3Coder, kCmd4 };
const char* chat_family_name(ChatFamily family);  // "qwen3", "qwen3_coder", "cmd4"

class ChatTemplate {
 public:
  // The family of a template's text, detected by content. Error for templates of no known family.
  static ChatTemplate from_text(std::string_view text);
  static ChatTemplate from_file(const std::filesystem::path& path);  // a .jinja file's text
  // model_dir/chat_template.jinja when present (as transformers prefers it), else the
  // "chat_template" of model_dir/tokenizer_config.json. Error when there is none.
  static ChatTemplate load(const std::filesystem::path& model_dir);

  ChatFamily family() const { return family_; }
  // Whether the text is byte for byte the published template this renderer reproduces; a
  // template of the family that differs elsewhere is still rendered as the published one.
  bool exact() const { return exact_; }

  // The prompt text. Error for conversations the template cannot render (empty, unknown roles,
  // a continued final message that the template drops, for cmd4 a tool result that answers no
  // tool call, ...); the message's index is named where one message is at fault.
  std::string render(const ChatInput& input) const;

 private:
  ChatTemplate(ChatFamily family, bool exact) : family_(family), exact_(exact) {}
  ChatFamily family_;
  bool exact_;
};

// cmd4's `reasoning` variable: whether its generation prompt leaves reasoning open
// (<|START_THINKING|>) rather than closed (<|START_THINKING|><|END_THINKING|>).
bool cmd4_reasoning(const ChatInput& input);

// The published templates' text fingerprints (FNV-1a, 64 bits, trailing newlines dropped).
uint64_t chat_template_fingerprint(std::string_view text);

}  // namespace megadecode
