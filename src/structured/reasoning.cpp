// Reasoning first, then the grammar.
#include "structured/reasoning.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode::structured {

AfterReasoning::AfterReasoning(std::shared_ptr<TokenConstraint> inner, std::vector<int32_t> end_of_reasoning, int vocab,
                               std::vector<int32_t> end_ids)
    : inner_(std::move(inner)), end_of_reasoning_(std::move(end_of_reasoning)), vocab_(vocab), end_ids_(std::move(end_ids)) {
  MD_REQUIRE(!end_of_reasoning_.empty(), "after_reasoning: the end-of-reasoning sequence is empty");
}

void AfterReasoning::fill_mask(std::span<uint32_t> words) const {
  if (!reasoning()) return inner_->fill_mask(words);
  std::fill(words.begin(), words.end(), 0u);
  for (int w = 0; w < vocab_ / 32; ++w) words[w] = ~0u;
  for (int t = vocab_ / 32 * 32; t < vocab_; ++t) words[t >> 5] |= 1u << (t & 31);
  for (const int32_t id : end_ids_) words[id >> 5] &= ~(1u << (id & 31));
}

bool AfterReasoning::accept(int32_t token) {
  if (!reasoning()) return inner_->accept(token);
  if (token < 0 || token >= vocab_ || std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) return false;
  recent_.push_back(token);
  if (recent_.size() > end_of_reasoning_.size()) recent_.erase(recent_.begin());
  done_ = recent_ == end_of_reasoning_;
  return true;
}

bool AfterReasoning::accepting() const { return !reasoning() && inner_->accepting(); }

bool AfterReasoning::finished() const { return !reasoning() && inner_->finished(); }

}  // namespace megadecode::structured
