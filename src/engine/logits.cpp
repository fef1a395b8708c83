// Logprobs and banned-token sampling on the host (see logits.h).
#include "engine/logits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "core/rng.h"

namespace megadecode {

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  float max_logit = kNegInf;
  bool any_nan = false;
  for (float x : logits) {
    if (std::isnan(x)) any_nan = true;
    max_logit = std::max(max_logit, x);
  }
  double sum = 0.0;
  if (std::isfinite(max_logit))
    for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_z = std::isfinite(max_logit) ? max_logit + std::log(sum) : 0.0;
  auto logprob_of = [&](int32_t t) -> float {
    if (any_nan) return std::numeric_limits<float>::quiet_NaN();
    if (t < 0 || t >= static_cast<int32_t>(logits.size())) return kNegInf;
    const float x = logits[t];
    if (!std::isfinite(max_logit) || x == kNegInf) return kNegInf;
    return static_cast<float>(x - log_z);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob_of(token);
  top = std::clamp<int>(top, 0, static_cast<int>(logits.size()));
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      const float la = std::isnan(logits[a]) ? kNegInf : logits[a];
      const float lb = std::isnan(logits[b]) ? kNegInf : logits[b];
      return la != lb ? la > lb : a < b;
    };
    std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), better);
    for (int i = 0; i < top; ++i) out.top.push_back(TopLogprob{ids[i], logprob_of(ids[i])});
  }
  return out;
}

int32_t sample_with_bans(std::span<const float> logits, const SamplingParams& params, int position,
                         std::span<const int32_t> history, int n_prompt, std::span<const int32_t> banned) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int vocab = static_cast<int>(logits.size());
  std::vector<float> x(logits.begin(), logits.end());
  for (float& v : x)
    if (std::isnan(v)) v = kNegInf;
  // Penalties (vLLM order: repetition, then frequency/presence), before temperature.
  if (params.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (int32_t t : history)
      if (t >= 0 && t < vocab) seen[t] = true;
    for (int t = 0; t < vocab; ++t)
      if (seen[t]) x[t] = x[t] > 0 ? x[t] / params.repetition_penalty : x[t] * params.repetition_penalty;
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int> count;
    for (size_t i = std::min<size_t>(n_prompt, history.size()); i < history.size(); ++i) ++count[history[i]];
    for (auto [t, c] : count)
      if (t >= 0 && t < vocab) x[t] -= params.frequency_penalty * c + params.presence_penalty;
  }
  for (int32_t t : banned)
    if (t >= 0 && t < vocab) x[t] = kNegInf;

  std::vector<int32_t> ids;
  ids.reserve(vocab);
  for (int t = 0; t < vocab; ++t)
    if (x[t] != kNegInf) ids.push_back(t);
  if (ids.empty()) return -1;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  if (params.greedy()) return ids.front();

  // Probabilities over the survivors, most likely first.
  std::vector<double> p(ids.size());
  double z = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) z += p[i] = std::exp((x[ids[i]] - x[ids[0]]) / params.temperature);
  for (double& v : p) v /= z;
  size_t keep = ids.size();
  if (params.top_k > 0) keep = std::min<size_t>(keep, params.top_k);
  if (params.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i];
      if (cum >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params.min_p > 0.0f)
    while (keep > 1 && p[keep - 1] < params.min_p * p[0]) --keep;
  // Exponential race: argmax p_i / E_i with E_i ~ Exp(1) from Philox(seed, position, token).
  size_t best = 0;
  double best_score = -1.0;
  for (size_t i = 0; i < keep; ++i) {
    Philox4 r = philox4x32(static_cast<uint32_t>(ids[i]), static_cast<uint32_t>(position), 0x5eed, 0,
                           static_cast<uint32_t>(params.seed), static_cast<uint32_t>(params.seed >> 32));
    const double e = -std::log(static_cast<double>(u32_to_unit_open0(r.v[0])));
    const double score = p[i] / e;
    if (score > best_score) {
      best_score = score;
      best = i;
    }
  }
  return ids[best];
}

}  // namespace megadecode
