// Host-side work on one row of raw logits [vocab]: log-probabilities for the logprobs fields,
// and sampling with banned tokens (the engine's min_tokens rule: before min_tokens tokens, the
// end tokens must not be sampled; the backend samples without bans, so when it picks a banned
// token the engine samples again here from the same logits).
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "engine/request.h"
#include "model/sampling_params.h"

namespace megadecode {

// log_softmax(logits)[token] and the `top` most likely tokens (ties: lower id first).
// -inf logits give -inf logprobs; a NaN row gives NaN.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

// Samples from `logits` after penalties (repetition over `history`, presence/frequency over
// history[n_prompt, end)), temperature, top-k, top-p and min-p, never returning a token of
// `banned`. Seeded by (params.seed, position). Greedy when params.greedy(). -1 when every token
// is banned or has -inf logit.
int32_t sample_with_bans(std::span<const float> logits, const SamplingParams& params, int position,
                         std::span<const int32_t> history, int n_prompt, std::span<const int32_t> banned);

}  // namespace megadecode
