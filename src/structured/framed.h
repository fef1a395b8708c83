// A constraint between fixed token sequences, for outputs whose frame is made of added tokens the
// grammar cannot spell (Qwen3's "<tool_call>" ... "</tool_call>"): first exactly the prefix ids,
// then the inner constraint; where the inner output is complete the suffix's first id may come
// (instead of an end token), then the rest of the suffix, then only an end token. The suffix's
// first id must be one the inner grammar never allows (an added or special token).
#pragma once

#include <memory>
#include <vector>

#include "engine/token_constraint.h"

namespace megadecode::structured {

class Framed final : public TokenConstraint {
 public:
  // vocab: the tokenizer's vocabulary size; end_ids: the sequence's end tokens.
  Framed(std::shared_ptr<TokenConstraint> inner, std::vector<int32_t> prefix, std::vector<int32_t> suffix, int vocab,
         std::vector<int32_t> end_ids);
  void fill_mask(std::span<uint32_t> words) const override;
  bool accept(int32_t token) override;
  bool accepting() const override;
  bool finished() const override;

 private:
  bool in_inner() const { return at_ >= prefix_.size() && at_suffix_ == 0; }
  bool is_end(int32_t token) const;

  std::shared_ptr<TokenConstraint> inner_;
  std::vector<int32_t> prefix_, suffix_;
  int vocab_;
  std::vector<int32_t> end_ids_;
  size_t at_ = 0;         // prefix ids read
  size_t at_suffix_ = 0;  // suffix ids read
};

}  // namespace megadecode::structured
