// A per-sequence limit on the tokens it may generate next (structured output: a JSON schema, JSON
// mode, a regex, a choice; see src/structured/), as the engine drives it:
//   1. before a step that samples a token for the sequence, fill_mask() writes the allowed set;
//   2. the backend samples only among allowed tokens (DecodeSeq::allowed, a packed bitmask a row);
//   3. the engine hands the sampled token to accept().
// A constraint belongs to one sequence (SequenceRequest::constraint) and is used from the engine's
// scheduler thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "sampling/token_mask.h"  // token_mask_words: bit (t % 32) of word t / 32 is token t

namespace megadecode {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // Writes the set of tokens that may come next into `words` (token_mask_words(vocab) entries,
  // every bit written: 1 = allowed). The sequence's end tokens are allowed exactly when the text
  // so far is complete (accepting()). Never all zero: a state with no way on allows the end tokens.
  virtual void fill_mask(std::span<uint32_t> words) const = 0;

  // Moves past `token`. False when fill_mask() would not have allowed it; the state is unchanged.
  virtual bool accept(int32_t token) = 0;

  // The text so far is complete: an end token may come next.
  virtual bool accepting() const = 0;

  // Nothing but an end token may come next: the engine ends the sequence ("stop") without
  // spending a step on sampling that end token.
  virtual bool finished() const = 0;
};

}  // namespace megadecode
