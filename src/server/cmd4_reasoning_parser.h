// Splits North Mini Code's cmd4 output ("cohere_command4", as melody's cmd4() options read it)
// into reasoning and content as it arrives in pieces. The output is in one channel at a time, and
// a marker anywhere switches it:
//   <|START_THINKING|>                         reasoning (where output starts when the prompt
//                                              ends in <|START_THINKING|>)
//   <|END_THINKING|>, <|START_TEXT|>,
//   <|START_RESPONSE|>                         the answer (content)
//   <|END_TEXT|>, <|END_RESPONSE|>             nothing: text up to the next marker is dropped
//   <|START_ACTION|> ... <|END_ACTION|>        an action block, passed on verbatim as content
//                                              (markers included) for the tool-call parser;
//                                              after it, nothing until the next marker
// The markers themselves are dropped. In reasoning and the answer, citation tags are removed and
// the cited text kept: "<co>" opens one, "</co: SOURCES>" closes it (SOURCES: digits, ':', '[',
// ']', ',' and spaces, e.g. "0:[1,2],1:[0]"); a "</co: " followed by anything else is text.
// Text that could still be a marker or a citation tag is held back until the next piece.
// Threading: one instance per generated sequence, used by one thread at a time.
#pragma once

#include <string>
#include <string_view>

#include "server/reasoning_parser.h"

namespace megadecode {

class Cmd4ReasoningParser {
 public:
  enum class Channel { kReasoning, kAnswer, kAction, kIgnore };
  // start: kReasoning after a prompt ending in <|START_THINKING|>, kAnswer after one ending in
  // <|START_THINKING|><|END_THINKING|>, kAction after a forced call's opening.
  explicit Cmd4ReasoningParser(Channel start) : channel_(start) {}

  ReasoningParser::Output push(std::string_view text);
  ReasoningParser::Output finish();  // the end of the text: releases whatever is held

 private:
  void scan(bool finishing, ReasoningParser::Output& out);
  void emit(std::string_view text, ReasoningParser::Output& out) const;

  Channel channel_;
  std::string pending_;  // text not yet classified
};

}  // namespace megadecode
