// ReasoningParser: a three-state split with a held-back tail (see reasoning_parser.h).
#include "server/reasoning_parser.h"

#include <algorithm>

#include "server/partial_tag.h"

namespace megadecode {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name) {
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  if (name == "cohere_command4") return ReasoningFormat::kCohereCommand4;
  return std::nullopt;
}

const char* reasoning_format_name(ReasoningFormat format) {
  return format == ReasoningFormat::kQwen3 ? "qwen3" : "cohere_command4";
}

ReasoningParser::Output ReasoningParser::push(std::string_view text) {
  Output out;
  if (state_ == State::kContent) {
    out.content = text;
    return out;
  }
  pending_ += text;
  if (state_ == State::kStart) {
    if (pending_.size() < kOpen.size() && kOpen.substr(0, pending_.size()) == pending_) return out;  // undecided
    if (pending_.compare(0, kOpen.size(), kOpen) != 0) {
      state_ = State::kContent;
      out.content = std::move(pending_);
      pending_.clear();
      return out;
    }
    pending_.erase(0, kOpen.size());
    state_ = State::kReasoning;
  }
  if (const size_t at = pending_.find(kClose); at != std::string::npos) {
    out.reasoning = pending_.substr(0, at);
    out.content = pending_.substr(at + kClose.size());
    pending_.clear();
    state_ = State::kContent;
    return out;
  }
  const size_t keep = partial_tag_suffix(pending_, kClose);
  out.reasoning = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

ReasoningParser::Output ReasoningParser::finish() {
  Output out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(pending_);
  } else {
    out.content = std::move(pending_);
  }
  pending_.clear();
  state_ = State::kContent;
  return out;
}

}  // namespace megadecode
