// render_chat: the plain-chat subset of the Qwen3 chat template (tokenizer_config.json), written
// out by hand. Mirrors the template step by step:
//   - a leading system message renders first; later system messages render like user messages;
//   - the "last query" is the last user message that is not a wrapped <tool_response>;
//   - an assistant message splits "<think>...</think>" off its content; after the last query
//     it re-renders the reasoning in a <think> block (always for the final message), earlier
//     ones render the content only;
//   - add_generation_prompt appends "<|im_start|>assistant\n" (default reasoning: no empty
//     think block).
// Tools, tool calls, tool messages, reasoning_content and enable_thinking are not supported.
#include <string_view>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
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

void render_assistant(const ChatMessage& m, bool after_last_query, bool is_last, std::string& out) {
  std::string_view content = m.content, reasoning;
  if (content.find("</think>") != std::string_view::npos) {
    reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(m.content, "</think>")), "<think>"));
    content = lstrip_newlines(after_last(m.content, "</think>"));
  }
  out += "<|im_start|>assistant\n";
  if (after_last_query && (is_last || !reasoning.empty())) {
    out += "<think>\n";
    out += rstrip_newlines(lstrip_newlines(reasoning));
    out += "\n</think>\n\n";
    out += lstrip_newlines(content);
  } else {
    out += content;
  }
  out += "<|im_end|>\n";
}

}  // namespace

std::string render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  MD_REQUIRE(!messages.empty(), "chat: the message list is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    MD_REQUIRE(role == "system" || role == "user" || role == "assistant", "chat: message ", i, " has role \"", role,
               "\"; supported roles are system, user and assistant (tool messages are not supported)");
  }
  // The index of the last user message that is not a tool response wrapped in <tool_response>.
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    if (messages[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      render_assistant(m, i > last_query, i + 1 == messages.size(), out);
    } else {  // user, or system (a first system message renders the same way)
      out += "<|im_start|>";
      out += m.role;
      out += '\n';
      out += m.content;
      out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace megadecode
