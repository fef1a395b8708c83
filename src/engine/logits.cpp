// Logprobs and banned-token sampling on the host (see logits.h).
#include "engine/logits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "sampling/host_sampler.h"

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

int32_t sample_with_bans(std::span<const float> logits, const SamplingParams& params, int64_t position,
                         std::span<const int32_t> history, size_t n_prompt, std::span<const int32_t> banned) {
  std::vector<float> masked(logits.begin(), logits.end());
  for (int32_t t : banned)
    if (t >= 0 && static_cast<size_t>(t) < masked.size()) masked[t] = -std::numeric_limits<float>::infinity();
  if (std::none_of(masked.begin(), masked.end(), [](float x) { return x > -std::numeric_limits<float>::infinity(); }))
    return -1;
  n_prompt = std::min(n_prompt, history.size());
  return sampling::sample_token(masked, params, position, sampling::TokenHistory{history.first(n_prompt), history.subspan(n_prompt)});
}

}  // namespace megadecode
