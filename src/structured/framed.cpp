// Prefix ids, the inner constraint, suffix ids.
#include "structured/framed.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode::structured {
namespace {

void only(std::span<uint32_t> words, std::span<const int32_t> ids) {
  std::fill(words.begin(), words.end(), 0u);
  for (const int32_t id : ids) words[id >> 5] |= 1u << (id & 31);
}

}  // namespace

Framed::Framed(std::shared_ptr<TokenConstraint> inner, std::vector<int32_t> prefix, std::vector<int32_t> suffix, int vocab,
               std::vector<int32_t> end_ids)
    : inner_(std::move(inner)), prefix_(std::move(prefix)), suffix_(std::move(suffix)), vocab_(vocab),
      end_ids_(std::move(end_ids)) {
  MD_REQUIRE(!end_ids_.empty(), "framed: no end token");
  for (const auto* ids : {&prefix_, &suffix_, &end_ids_})
    for (const int32_t id : *ids) MD_REQUIRE(id >= 0 && id < vocab_, "framed: token ", id, " is outside the vocabulary");
}

bool Framed::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

void Framed::fill_mask(std::span<uint32_t> words) const {
  if (at_ < prefix_.size()) return only(words, std::span(&prefix_[at_], 1));
  if (at_suffix_ == suffix_.size() && !suffix_.empty()) return only(words, end_ids_);
  if (at_suffix_ > 0) return only(words, std::span(&suffix_[at_suffix_], 1));
  inner_->fill_mask(words);
  if (suffix_.empty()) return;
  for (const int32_t id : end_ids_) words[id >> 5] &= ~(1u << (id & 31));  // the suffix ends the inner output
  if (inner_->accepting()) words[suffix_[0] >> 5] |= 1u << (suffix_[0] & 31);
  if (std::all_of(words.begin(), words.end(), [](uint32_t w) { return w == 0; })) only(words, end_ids_);
}

bool Framed::accept(int32_t token) {
  if (at_ < prefix_.size()) {
    if (token != prefix_[at_]) return false;
    ++at_;
    return true;
  }
  if (!suffix_.empty() && at_suffix_ == suffix_.size()) return is_end(token);
  if (at_suffix_ > 0) {
    if (token != suffix_[at_suffix_]) return false;
    ++at_suffix_;
    return true;
  }
  if (!suffix_.empty() && token == suffix_[0]) {
    if (!inner_->accepting()) return false;
    at_suffix_ = 1;
    return true;
  }
  if (!suffix_.empty() && is_end(token)) {  // allowed only where nothing else is (fill_mask)
    std::vector<uint32_t> words(token_mask_words(vocab_));
    fill_mask(words);
    return (words[token >> 5] >> (token & 31)) & 1u;
  }
  return inner_->accept(token);
}

bool Framed::accepting() const {
  if (suffix_.empty()) return at_ == prefix_.size() && inner_->accepting();
  return at_suffix_ == suffix_.size();
}

bool Framed::finished() const {
  if (suffix_.empty()) return at_ == prefix_.size() && inner_->finished();
  return at_suffix_ == suffix_.size();
}

}  // namespace megadecode::structured
