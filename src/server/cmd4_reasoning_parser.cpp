// Cmd4ReasoningParser: a channel switch on markers, with a held-back tail (see
// cmd4_reasoning_parser.h).
#include "server/cmd4_reasoning_parser.h"

#include <algorithm>
#include <array>

#include "server/partial_tag.h"

namespace megadecode {
namespace {

using Channel = Cmd4ReasoningParser::Channel;

struct Marker {
  std::string_view text;
  Channel next;
};

constexpr std::array<Marker, 7> kMarkers = {{
    {"<|START_THINKING|>", Channel::kReasoning},
    {"<|END_THINKING|>", Channel::kAnswer},
    {"<|START_TEXT|>", Channel::kAnswer},
    {"<|START_RESPONSE|>", Channel::kAnswer},
    {"<|END_TEXT|>", Channel::kIgnore},
    {"<|END_RESPONSE|>", Channel::kIgnore},
    {"<|START_ACTION|>", Channel::kAction},
}};
constexpr std::string_view kEndAction = "<|END_ACTION|>";
constexpr std::string_view kCiteOpen = "<co>";
constexpr std::string_view kCiteClose = "</co: ";  // then the sources, then '>'

bool is_source_char(char c) {
  return (c >= '0' && c <= '9') || c == ':' || c == '[' || c == ']' || c == ',' || c == ' ';
}

}  // namespace

ReasoningParser::Output Cmd4ReasoningParser::push(std::string_view text) {
  ReasoningParser::Output out;
  pending_ += text;
  scan(/*finishing=*/false, out);
  return out;
}

ReasoningParser::Output Cmd4ReasoningParser::finish() {
  ReasoningParser::Output out;
  scan(/*finishing=*/true, out);
  pending_.clear();
  return out;
}

void Cmd4ReasoningParser::emit(std::string_view text, ReasoningParser::Output& out) const {
  if (channel_ == Channel::kReasoning) out.reasoning += text;
  else if (channel_ != Channel::kIgnore) out.content += text;
}

void Cmd4ReasoningParser::scan(bool finishing, ReasoningParser::Output& out) {
  const std::string_view s = pending_;
  size_t pos = 0;  // s[0, pos) is classified
  for (;;) {
    if (channel_ == Channel::kAction) {  // verbatim up to and including <|END_ACTION|>
      const size_t at = s.find(kEndAction, pos);
      if (at == std::string_view::npos) {
        const size_t keep = finishing ? 0 : partial_tag_suffix(s.substr(pos), kEndAction);
        emit(s.substr(pos, s.size() - pos - keep), out);
        pos = s.size() - keep;
        break;
      }
      emit(s.substr(pos, at + kEndAction.size() - pos), out);
      pos = at + kEndAction.size();
      channel_ = Channel::kIgnore;
      continue;
    }
    // The first marker (or, outside kIgnore, citation tag) at or after pos.
    const bool cites = channel_ != Channel::kIgnore;
    size_t best = std::string_view::npos;
    const Marker* marker = nullptr;
    for (const Marker& m : kMarkers) {
      const size_t at = s.find(m.text, pos);
      if (at < best) {
        best = at;
        marker = &m;
      }
    }
    std::string_view tag;
    if (cites) {
      for (std::string_view t : {kCiteOpen, kCiteClose}) {
        const size_t at = s.find(t, pos);
        if (at < best) {
          best = at;
          tag = t;
          marker = nullptr;
        }
      }
    }
    if (best == std::string_view::npos) {
      size_t keep = 0;
      if (!finishing) {
        for (const Marker& m : kMarkers) keep = std::max(keep, partial_tag_suffix(s.substr(pos), m.text));
        if (cites)
          for (std::string_view t : {kCiteOpen, kCiteClose}) keep = std::max(keep, partial_tag_suffix(s.substr(pos), t));
      }
      emit(s.substr(pos, s.size() - pos - keep), out);
      pos = s.size() - keep;
      break;
    }
    emit(s.substr(pos, best - pos), out);
    if (marker != nullptr) {
      channel_ = marker->next;
      pos = best + marker->text.size();
      if (channel_ == Channel::kAction) emit(marker->text, out);  // the tool-call parser's opening tag
      continue;
    }
    if (tag == kCiteOpen) {
      pos = best + kCiteOpen.size();
      continue;
    }
    size_t end = best + kCiteClose.size();  // "</co: ": the sources, then '>'
    while (end < s.size() && is_source_char(s[end])) ++end;
    if (end == s.size() && !finishing) {
      pos = best;  // the sources may go on: hold the tag
      break;
    }
    if (end < s.size() && s[end] == '>') {
      pos = end + 1;
      continue;
    }
    emit(kCiteClose, out);  // not a citation's end after all (or cut off): plain text
    pos = best + kCiteClose.size();
  }
  pending_.erase(0, pos);
}

}  // namespace megadecode
