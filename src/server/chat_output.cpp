// ChatOutputParser: the reasoning split (Qwen3's or cmd4's) feeding the tool-call parser (see
// chat_output.h).
#include "server/chat_output.h"

namespace megadecode {

ChatOutputParser::ChatOutputParser(ChatOutputOptions options) : options_(std::move(options)) {
  const bool primed = options_.tool_format && !options_.primed.empty();
  if (options_.reasoning_format == ReasoningFormat::kQwen3 && options_.reasoning) reasoning_.emplace();
  if (options_.reasoning_format == ReasoningFormat::kCohereCommand4) {
    using Channel = Cmd4ReasoningParser::Channel;
    const bool in_action = primed && options_.tool_format == ToolCallFormat::kCohereCommand4;
    cmd4_.emplace(in_action ? Channel::kAction : options_.reasoning ? Channel::kReasoning : Channel::kAnswer);
  }
  if (options_.tool_format) {
    if (!options_.tools) options_.tools = std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::array());
    tools_.emplace(*options_.tool_format, *options_.tools, options_.parallel_tool_calls);
    if (primed) tools_->push(options_.primed);  // opens the call: releases nothing
  }
}

ReasoningParser::Output ChatOutputParser::split(std::string_view text, bool finishing) {
  ReasoningParser::Output r;
  auto run = [&](auto& parser) {
    r = parser.push(text);
    if (!finishing) return;
    ReasoningParser::Output rest = parser.finish();
    r.reasoning += rest.reasoning;
    r.content += rest.content;
  };
  if (reasoning_) {
    run(*reasoning_);
  } else if (cmd4_) {
    run(*cmd4_);
  } else {
    r.content = text;
  }
  if (!options_.include_reasoning) r.reasoning.clear();
  return r;
}

void ChatOutputParser::add_content(std::string_view text, bool finishing, ChatDelta& out) {
  if (!tools_) {
    out.content += text;
    return;
  }
  ToolCallParser::Output t = tools_->push(text);
  out.content += t.content;
  for (ParsedToolCall& c : t.calls) out.calls.push_back(std::move(c));
  if (finishing) {
    t = tools_->finish();
    out.content += t.content;
    for (ParsedToolCall& c : t.calls) out.calls.push_back(std::move(c));
  }
}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ChatDelta out;
  ReasoningParser::Output r = split(text, /*finishing=*/false);
  out.reasoning = std::move(r.reasoning);
  add_content(r.content, false, out);
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  ReasoningParser::Output r = split({}, /*finishing=*/true);
  out.reasoning = std::move(r.reasoning);
  add_content(r.content, true, out);
  return out;
}

}  // namespace megadecode
