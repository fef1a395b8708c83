// Splits Qwen3's reasoning off generated text that arrives in pieces: output that begins with
// <think> is reasoning up to </think>, the rest is content (tags may be split anywhere between
// pieces; text that could still be a tag is held back). Output that does not begin with <think>
// is all content; reasoning that never closes (the sequence hit max_tokens) stays reasoning, as
// vLLM's qwen3 parser has it. The tags themselves are dropped; the text between is kept as is.
// Threading: one instance per generated sequence, used by one thread at a time.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace megadecode {

// The --reasoning-parser formats: Qwen3's <think> block (this class) and North's cmd4 markers
// (Cmd4ReasoningParser, cmd4_reasoning_parser.h).
enum class ReasoningFormat { kQwen3, kCohereCommand4 };
std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name);  // "qwen3", "cohere_command4"
const char* reasoning_format_name(ReasoningFormat format);

class ReasoningParser {
 public:
  struct Output {
    std::string reasoning;
    std::string content;
  };
  Output push(std::string_view text);
  Output finish();  // the end of the text: releases whatever is held

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_ = State::kStart;
  std::string pending_;  // text not yet classified
};

}  // namespace megadecode
