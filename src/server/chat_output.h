// A chat choice's generated text split the way the model's format says: reasoning (Qwen3's
// <think> block, or cmd4's channels), content, and tool calls, incrementally as text arrives.
// Streaming and non-streaming responses both come from it, so they always agree.
// Threading: one parser per choice, used on its connection's strand.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/cmd4_reasoning_parser.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace megadecode {

// How one request's choices are parsed (fixed when the request is accepted).
struct ChatOutputOptions {
  bool reasoning = false;          // the output starts in reasoning (thinking not switched off)
  // How reasoning is split off: Qwen3's <think> only while `reasoning`; cmd4's channels always,
  // since its markers (<|START_TEXT|>, citations, ...) wrap the answer too.
  ReasoningFormat reasoning_format = ReasoningFormat::kQwen3;
  bool include_reasoning = true;   // vLLM's include_reasoning: false drops the reasoning
  std::optional<ToolCallFormat> tool_format;  // parse tool calls (tools given, tool_choice not "none")
  std::shared_ptr<const nlohmann::ordered_json> tools;  // the request's tool list
  bool parallel_tool_calls = true;
  std::string primed;  // the opening of a forced call, which ends the prompt: parsed as if generated
  bool active() const { return reasoning || is_cmd4() || tool_format.has_value(); }
  // cmd4's markers are special tokens: its parsers read them, so the text must keep them.
  bool is_cmd4() const {
    return reasoning_format == ReasoningFormat::kCohereCommand4 || tool_format == ToolCallFormat::kCohereCommand4;
  }
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> calls;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions options);
  ChatDelta push(std::string_view text);
  ChatDelta finish();
  int n_calls() const { return tools_ ? tools_->n_calls() : 0; }

 private:
  void add_content(std::string_view text, bool finishing, ChatDelta& out);
  ReasoningParser::Output split(std::string_view text, bool finishing);

  ChatOutputOptions options_;
  std::optional<ReasoningParser> reasoning_;
  std::optional<Cmd4ReasoningParser> cmd4_;
  std::optional<ToolCallParser> tools_;
};

}  // namespace megadecode
