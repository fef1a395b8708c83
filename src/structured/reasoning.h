// A constraint that starts after the model's reasoning: every text token is allowed (end tokens
// are not: the answer has not begun) until the end-of-reasoning token sequence has been generated
// (Qwen3 "</think>", North "<|END_THINKING|>", as token ids), then the inner constraint applies.
#pragma once

#include <memory>
#include <vector>

#include "engine/token_constraint.h"

namespace megadecode::structured {

class AfterReasoning final : public TokenConstraint {
 public:
  // vocab: the tokenizer's vocabulary size; end_ids: the sequence's end tokens (kept out while
  // reasoning); end_of_reasoning: the ids that close the reasoning, in order (non-empty).
  AfterReasoning(std::shared_ptr<TokenConstraint> inner, std::vector<int32_t> end_of_reasoning, int vocab,
                 std::vector<int32_t> end_ids);
  void fill_mask(std::span<uint32_t> words) const override;
  bool accept(int32_t token) override;
  bool accepting() const override;
  bool finished() const override;
  bool reasoning() const { return !done_; }

 private:
  std::shared_ptr<TokenConstraint> inner_;
  std::vector<int32_t> end_of_reasoning_;
  int vocab_;
  std::vector<int32_t> end_ids_;
  std::vector<int32_t> recent_;  // the last tokens, at most end_of_reasoning_.size()
  bool done_ = false;
};

}  // namespace megadecode::structured
