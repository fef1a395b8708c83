#include "sampling/host_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"
#include "sampling/token_mask.h"

namespace megadecode::sampling {
namespace {

void check_history(std::span<const int32_t> ids, size_t vocab, const char* what) {
  for (int32_t id : ids) {
    MD_REQUIRE(id >= 0 && static_cast<size_t>(id) < vocab, "sampling: ", what, " token id ", id,
               " outside the vocabulary [0, ", vocab, ")");
  }
}

int32_t argmax_lowest(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lower id
  }
  return static_cast<int32_t>(best);
}

}  // namespace

void apply_penalties(std::span<float> logits, const SamplingParams& p, const TokenHistory& history) {
  const size_t vocab = logits.size();
  check_history(history.prompt, vocab, "prompt");
  check_history(history.output, vocab, "output");
  const bool repetition = p.repetition_penalty != 1.0f;
  const bool additive = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (!repetition && !additive) return;
  std::vector<uint8_t> seen(repetition ? vocab : 0, 0);
  std::vector<int32_t> counts(vocab, 0);  // occurrences in the output
  for (int32_t id : history.output) ++counts[id];
  if (repetition) {
    for (int32_t id : history.prompt) seen[id] = 1;
    for (int32_t id : history.output) seen[id] = 1;
    for (size_t i = 0; i < vocab; ++i) {
      if (seen[i]) logits[i] = logits[i] > 0.0f ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
    }
  }
  if (additive) {
    for (size_t i = 0; i < vocab; ++i) {
      if (counts[i] == 0) continue;
      logits[i] -= p.frequency_penalty * static_cast<float>(counts[i]);
      logits[i] -= p.presence_penalty;
    }
  }
}

float sampling_gumbel(uint64_t seed, int64_t position, int32_t token) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const Philox4 r = philox4x32(static_cast<uint32_t>(token), static_cast<uint32_t>(pos),
                               static_cast<uint32_t>(pos >> 32), 0, static_cast<uint32_t>(seed),
                               static_cast<uint32_t>(seed >> 32));
  const float u = (static_cast<float>(r.v[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -std::log(-std::log(u));
}

namespace {

// Steps 1-6 with the penalised logits kept for the draw.
struct Kept {
  std::vector<float> logits;  // [vocab] after penalties
  std::vector<Candidate> candidates;
};

Kept keep(std::span<const float> raw_logits, const SamplingParams& p, const TokenHistory& history,
          std::span<const uint32_t> allowed, bool ordered = true);

}  // namespace

namespace {

// ordered = false: the caller only draws among the candidates (sample_token), so when neither
// top-k nor top-p cuts the kept set it comes back in id order, unsorted and without probabilities
// (a sort of a 152K-token vocabulary a row a step is most of a CPU backend's sampling). top_p = 1
// then keeps every token, as the device sampler does (it skips its top-p pass at 1); the sorted
// path's running mass could round up to 1 before a tail of negligible tokens.
Kept keep(std::span<const float> raw_logits, const SamplingParams& p, const TokenHistory& history,
          std::span<const uint32_t> allowed, bool ordered) {
  validate(p);
  MD_REQUIRE(!raw_logits.empty(), "sampling: empty logits");
  Kept result;
  std::vector<float>& logits = result.logits;
  logits.assign(raw_logits.begin(), raw_logits.end());
  apply_token_mask(logits, allowed);  // disallowed tokens are -inf from here on (NaN ones included)
  for (float l : logits) MD_REQUIRE(!std::isnan(l) && l != INFINITY, "sampling: logits contain NaN or +inf");
  apply_penalties(logits, p, history);
  if (p.greedy()) {
    result.candidates = {Candidate{argmax_lowest(logits), 1.0}};
    return result;
  }
  MD_REQUIRE(std::any_of(logits.begin(), logits.end(), [](float l) { return l > -INFINITY; }),
             "sampling: every logit is -inf");

  // Temperature: unnormalised masses exp((l - max) * (1/T)) in fp32 (the device sampler's form);
  // p = mass / sum. min-p compares p / max(p) = mass with min_p.
  const size_t vocab = logits.size();
  const float max_l = *std::max_element(logits.begin(), logits.end());
  const float inv_t = 1.0f / p.temperature;
  std::vector<float> probs(vocab);  // masses
  std::vector<int32_t> kept;
  kept.reserve(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp((logits[i] - max_l) * inv_t);
    if (probs[i] > 0.0f && probs[i] >= p.min_p) kept.push_back(static_cast<int32_t>(i));
  }
  if (kept.empty()) kept.push_back(argmax_lowest(logits));  // every probability underflowed but the max
  if (!ordered && p.top_p >= 1.0f && (p.top_k <= 0 || static_cast<size_t>(p.top_k) >= kept.size())) {
    for (int32_t id : kept) result.candidates.push_back({id, 0.0});
    return result;
  }

  // Canonical order; top-k keeps the first k.
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < kept.size()) {
    std::partial_sort(kept.begin(), kept.begin() + p.top_k, kept.end(), before);
    kept.resize(p.top_k);
  } else {
    std::sort(kept.begin(), kept.end(), before);
  }

  // Normalise over the kept tokens (double) and cut at top-p.
  double total = 0.0;
  for (int32_t id : kept) total += probs[id];
  std::vector<Candidate>& out = result.candidates;
  double mass_before = 0.0;
  for (int32_t id : kept) {
    if (!out.empty() && mass_before >= static_cast<double>(p.top_p)) break;
    const double q = probs[id] / total;
    out.push_back({id, q});
    mass_before += q;
  }
  double kept_total = 0.0;
  for (const Candidate& c : out) kept_total += c.prob;
  for (Candidate& c : out) c.prob /= kept_total;
  return result;
}

}  // namespace

std::vector<Candidate> sampling_candidates(std::span<const float> logits, const SamplingParams& p,
                                           const TokenHistory& history, std::span<const uint32_t> allowed) {
  return keep(logits, p, history, allowed).candidates;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, int64_t position,
                     const TokenHistory& history, std::span<const uint32_t> allowed) {
  // The draw is an argmax over the candidates (ties to the lower id): their order does not matter.
  const Kept kept = keep(logits, p, history, allowed, /*ordered=*/false);
  if (kept.candidates.size() == 1) return kept.candidates[0].id;
  const float inv_t = 1.0f / p.temperature;
  int32_t best = -1;
  float best_score = -INFINITY;
  for (const Candidate& c : kept.candidates) {
    const float score = kept.logits[c.id] * inv_t + sampling_gumbel(p.seed, position, c.id);
    if (best < 0 || score > best_score || (score == best_score && c.id < best)) {
      best = c.id;
      best_score = score;
    }
  }
  return best;
}

}  // namespace megadecode::sampling
