// Packed token masks (structured output, engine/token_constraint.h): one bit a token, bit (t % 32)
// of word t / 32 is token t, 1 = allowed. Every sampler reads a row's mask the same way: the logit of
// a token whose bit is clear counts as -inf before penalties, temperature and the filters, so greedy
// and sampled rows alike pick among allowed tokens only, and a mask that allows everything changes
// nothing. Host and device code both compile the inline reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/host_device.h"

namespace megadecode {

// Words of a packed token mask for a vocabulary of `vocab` ids.
constexpr size_t token_mask_words(int vocab) { return (static_cast<size_t>(vocab) + 31) / 32; }

// Whether `words` (a mask, token < 32 * its words) allows `token`.
MD_HOST_DEVICE inline bool token_mask_allows(const uint32_t* words, int32_t token) {
  return ((words[token >> 5] >> (token & 31)) & 1u) != 0;
}

namespace sampling {

// An empty mask allows every token.
inline bool mask_allows(std::span<const uint32_t> mask, int32_t token) {
  return mask.empty() || token_mask_allows(mask.data(), token);
}

// Checks a row's mask against its vocabulary: token_mask_words(vocab) words (or none) with at least
// one token of [0, vocab) allowed. Error naming the problem otherwise.
void check_token_mask(std::span<const uint32_t> mask, size_t vocab);

// Sets the logits of the tokens `mask` does not allow to -inf (nothing for an empty mask).
void apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask);

}  // namespace sampling
}  // namespace megadecode
