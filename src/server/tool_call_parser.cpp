// ToolCallParser: incremental tag scanning with a held-back tail (see tool_call_parser.h).
#include "server/tool_call_parser.h"

#include <algorithm>

#include "server/partial_tag.h"

namespace megadecode {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

ToolCallParser::ToolCallParser(ToolCallFormat format, const nlohmann::ordered_json& tools, bool parallel_tool_calls)
    : format_(format), tools_(tools), parallel_(parallel_tool_calls), tags_(tool_call_tags(format)) {}

ToolCallParser::Output ToolCallParser::push(std::string_view text) {
  Output out;
  buffer_ += text;
  scan(out);
  return out;
}

ToolCallParser::Output ToolCallParser::finish() {
  Output out;
  if (open_ >= 0) {
    end_call(buffer_, /*closed=*/false, out);  // cut off: a call when what came is complete
  } else {
    emit_text(buffer_, out);  // a held partial tag is plain text after all
  }
  buffer_.clear();
  open_ = -1;
  if (n_calls_ == 0) out.content += held_blank_;
  held_blank_.clear();
  return out;
}

void ToolCallParser::scan(Output& out) {
  for (;;) {
    if (open_ < 0) {
      size_t best = std::string::npos;
      for (size_t k = 0; k < tags_.size(); ++k) {
        const size_t at = buffer_.find(tags_[k].open);
        if (at < best) {
          best = at;
          open_ = static_cast<int>(k);
        }
      }
      if (best == std::string::npos) {
        size_t keep = 0;
        for (const ToolCallTags& t : tags_) keep = std::max(keep, partial_tag_suffix(buffer_, t.open));
        emit_text(std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
        buffer_.erase(0, buffer_.size() - keep);
        return;
      }
      emit_text(std::string_view(buffer_).substr(0, best), out);
      buffer_.erase(0, best + tags_[static_cast<size_t>(open_)].open.size());
      searched_ = 0;
    }
    const std::string_view close = tags_[static_cast<size_t>(open_)].close;
    const size_t at = buffer_.find(close, searched_);
    if (at == std::string::npos) {
      searched_ = buffer_.size() >= close.size() ? buffer_.size() - close.size() + 1 : 0;
      return;
    }
    end_call(std::string_view(buffer_).substr(0, at), /*closed=*/true, out);
    buffer_.erase(0, at + close.size());
    open_ = -1;
  }
}

void ToolCallParser::emit_text(std::string_view text, Output& out) {
  size_t end = text.size();
  while (end > 0 && is_blank(text[end - 1])) --end;
  if (end == 0) {
    held_blank_ += text;
    return;
  }
  out.content += held_blank_;
  out.content += text.substr(0, end);
  held_blank_ = text.substr(end);
}

void ToolCallParser::end_call(std::string_view body, bool closed, Output& out) {
  const ToolCallTags& tags = tags_[static_cast<size_t>(open_)];
  if (auto calls = parse_tool_calls(format_, tags, body, tools_)) {
    held_blank_.clear();
    for (ParsedToolCall& call : *calls) {
      if (parallel_ || n_calls_ == 0) out.calls.push_back(std::move(call));
      ++n_calls_;
    }
    return;
  }
  std::string raw(tags.open);
  raw += body;
  if (closed) raw += tags.close;
  emit_text(raw, out);
}

}  // namespace megadecode
