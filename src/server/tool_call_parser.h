// Finds the tool calls in generated text that arrives in pieces (tags may be split anywhere
// between pieces). Text outside calls is content, released as soon as it cannot be the start of
// a tag; a call (for cohere_command4, an action block and all its calls) is held until its closing
// tag and released whole, so a malformed one (or one cut off at the end) is returned as the plain
// text it was, never half a call. Whitespace next to a call is dropped (the text before a call is
// usually "\n\n"). With parallel_tool_calls false, calls after the first are dropped, as vLLM does.
// Threading: one instance per generated sequence, used by one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/tool_call_formats.h"

namespace megadecode {

class ToolCallParser {
 public:
  struct Output {
    std::string content;
    std::vector<ParsedToolCall> calls;
  };
  // tools: the request's tool list (kept by reference; it must outlive the parser).
  ToolCallParser(ToolCallFormat format, const nlohmann::ordered_json& tools, bool parallel_tool_calls);

  Output push(std::string_view text);
  Output finish();  // the end of the text: releases whatever is held
  int n_calls() const { return n_calls_; }

 private:
  void scan(Output& out);
  void emit_text(std::string_view text, Output& out);
  void end_call(std::string_view body, bool closed, Output& out);

  ToolCallFormat format_;
  const nlohmann::ordered_json& tools_;
  bool parallel_;
  std::vector<ToolCallTags> tags_;
  std::string buffer_;       // text not yet classified
  int open_ = -1;            // index into tags_ while inside a call
  size_t searched_ = 0;      // inside a call: buffer_ holds no closing tag before this offset
  std::string held_blank_;   // whitespace after the last released content
  int n_calls_ = 0;          // well-formed calls seen (returned or, without parallel calls, dropped)
};

}  // namespace megadecode
