// Host-side work on one row of raw logits [vocab]: log-probabilities for the logprobs fields, and
// sampling with banned tokens (the engine's min_tokens rule: before min_tokens tokens, the end
// tokens must not be sampled; the backend samples without bans, so when it picks a banned token
// the engine samples again here, with the host sampler, from the same logits and (seed, position)).
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "engine/request.h"
#include "sampling/params.h"

namespace megadecode {

// log_softmax(logits)[token] and the `top` most likely tokens (ties: lower id first).
// -inf logits give -inf logprobs; a NaN row gives NaN.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

// The host sampler's token (sampling::sample_token, the backends' semantics) for `logits` with every
// token of `banned` removed and, with a token mask `allowed` (structured output; empty: every token),
// only the tokens it allows; -1 when nothing is left. `history` is prompt then output, the first
// n_prompt tokens being the prompt; `position` is the position the sampled token will take.
int32_t sample_with_bans(std::span<const float> logits, const SamplingParams& params, int64_t position,
                         std::span<const int32_t> history, size_t n_prompt, std::span<const int32_t> banned,
                         std::span<const uint32_t> allowed = {});

}  // namespace megadecode
