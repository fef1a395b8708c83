// The host sampler: picks the next token from one sequence's logits (cpu-ref backend, and any
// backend that samples on the host). vLLM's semantics and order (vllm/v1/sample/sampler.py):
//   1. penalties on the raw logits: repetition (tokens of prompt or output: l>0 ? l/r : l*r),
//      then frequency (l -= f * count in output) and presence (l -= p if in output);
//   2. greedy (SamplingParams::greedy(): temperature < kGreedyTemperature): argmax, ties to the
//      lowest id; done.
//   3. temperature: masses m = exp((l - max l) * (1/T)) in fp32, p = m / sum(m) (= softmax(l / T));
//   4. min-p: drop tokens with p < min_p * max(p), i.e. m < min_p;
//   5. top-k: keep the k most likely of the rest (ties to the lower id: exactly k tokens);
//   6. top-p: renormalise the rest; keep the shortest most-likely-first prefix whose mass reaches
//      top_p (a token is kept when the mass before it is < top_p; at least one token);
//   7. draw (Gumbel-max, as the device sampler): the kept token maximising
//      logit_i * (1/T) + g_i, ties to the lower id, with g_i = -log(-log(u_i)) in fp32 and
//      u_i = ((v0 >> 8) + 0.5) / 2^24 in (0, 1), v0 from Philox4x32-10 with counter
//      (i, position lo, position hi, 0) and key (seed lo, seed hi). This picks i with the kept
//      tokens' renormalised probability; one (seed, position) gives one token whatever the batch,
//      and the same token as the device sampler given the same logits.
// `position` is the sequence position the sampled token will take. `allowed` (structured output,
// sampling/token_mask.h; empty: every token) comes first of all: the logits of the tokens it does not
// allow count as -inf before step 1, so no mode ever picks one, and a mask that allows every token
// gives exactly the unconstrained token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/params.h"

namespace megadecode::sampling {

// The tokens penalties look at: repetition sees prompt and output, presence/frequency only output.
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
};

// Step 1 in place. Error for a history token outside [0, logits.size()).
void apply_penalties(std::span<float> logits, const SamplingParams& params, const TokenHistory& history);

// The Gumbel noise g_i of token i for (seed, position).
float sampling_gumbel(uint64_t seed, int64_t position, int32_t token);

// One kept token and its renormalised probability.
struct Candidate {
  int32_t id;
  double prob;
};

// Steps 1-6: the tokens the draw chooses from, in canonical order, probabilities summing to 1
// (one token with probability 1 when greedy). Error for NaN logits or bad parameters (validate()).
std::vector<Candidate> sampling_candidates(std::span<const float> logits, const SamplingParams& params,
                                           const TokenHistory& history, std::span<const uint32_t> allowed = {});

// The sampled token (steps 1-7).
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, int64_t position,
                     const TokenHistory& history, std::span<const uint32_t> allowed = {});

}  // namespace megadecode::sampling
