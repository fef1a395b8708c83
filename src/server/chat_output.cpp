// ChatOutputParser: the reasoning split feeding the tool-call parser (see chat_output.h).
#include "server/chat_output.h"

namespace megadecode {

ChatOutputParser::ChatOutputParser(ChatOutputOptions options) : options_(std::move(options)) {
  if (options_.reasoning) reasoning_.emplace();
  if (options_.tool_format) {
    if (!options_.tools) options_.tools = std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::array());
    tools_.emplace(*options_.tool_format, *options_.tools, options_.parallel_tool_calls);
    if (!options_.primed.empty()) tools_->push(options_.primed);  // opens the call: releases nothing
  }
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
  if (!reasoning_) {
    add_content(text, false, out);
    return out;
  }
  ReasoningParser::Output r = reasoning_->push(text);
  if (options_.include_reasoning) out.reasoning = std::move(r.reasoning);
  add_content(r.content, false, out);
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  std::string content;
  if (reasoning_) {
    ReasoningParser::Output r = reasoning_->finish();
    if (options_.include_reasoning) out.reasoning = std::move(r.reasoning);
    content = std::move(r.content);
  }
  add_content(content, true, out);
  return out;
}

}  // namespace megadecode
