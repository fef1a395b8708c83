// check_token_mask, apply_token_mask (see token_mask.h).
#include "sampling/token_mask.h"

#include <limits>

#include "core/check.h"

namespace megadecode::sampling {

void check_token_mask(std::span<const uint32_t> mask, size_t vocab) {
  if (mask.empty()) return;
  MD_REQUIRE(mask.size() == token_mask_words(static_cast<int>(vocab)), "sampling: a token mask of ", mask.size(),
             " words for a vocabulary of ", vocab, " (", token_mask_words(static_cast<int>(vocab)), " words)");
  const size_t full = vocab / 32;
  bool any = false;
  for (size_t w = 0; w < full && !any; ++w) any = mask[w] != 0;
  if (!any && vocab % 32 != 0) any = (mask[full] & ((1u << (vocab % 32)) - 1u)) != 0;
  MD_REQUIRE(any, "sampling: the token mask allows no token of the vocabulary");
}

void apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask) {
  if (mask.empty()) return;
  const size_t vocab = logits.size();
  check_token_mask(mask, vocab);
  for (size_t t = 0; t < vocab; ++t)
    if (!token_mask_allows(mask.data(), static_cast<int32_t>(t))) logits[t] = -std::numeric_limits<float>::infinity();
}

}  // namespace megadecode::sampling
