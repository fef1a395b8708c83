// Logprobs and banned-token sampling on the host (see logits.h).
#include "engine/logits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"

namespace megadecode {
namespace {

// exp(x) for x <= 0 (NaN and -inf give 0), written so the compiler vectorises it: x = n ln2 + r
// with |r| <= ln2/2 (ln2 in two parts), exp(r) by its Taylor series to r^7 (relative error below
// 2e-7 there), times 2^n built in the exponent bits. Below -87 (2^-126) it returns 0.
inline float exp_nonpositive(float x) {
  x = x > -87.0f ? x : -87.0f;  // also NaN -> -87 (its result is zeroed below)
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x > -87.0f ? p * scale : 0.0f;
}

constexpr size_t kLanes = 8;

// sum over i of exp(x[i] - max) for max finite and every x[i] <= max (NaN counts 0): 8 float
// lanes (independent sums the compiler keeps in vector registers) over blocks of 512, each
// block's lanes summed in double.
double sum_exp(std::span<const float> x, float max) {
  double sum = 0.0;
  for (size_t b = 0; b < x.size(); b += 512) {
    const size_t e = std::min(x.size(), b + 512);
    float lane[kLanes] = {};
    size_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lane[j] += exp_nonpositive(x[i + j] - max);
    for (; i < e; ++i) lane[0] += exp_nonpositive(x[i] - max);
    for (float v : lane) sum += v;
  }
  return sum;
}

// The largest value (NaN skipped; -inf when there is none) and whether any is NaN, in 8 lanes.
float max_of(std::span<const float> x, bool* any_nan) {
  float lane[kLanes], nan_lane[kLanes];
  for (size_t j = 0; j < kLanes; ++j) lane[j] = -std::numeric_limits<float>::infinity(), nan_lane[j] = 0.0f;
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = x[i + j];
      lane[j] = v > lane[j] ? v : lane[j];
      nan_lane[j] = v != v ? 1.0f : nan_lane[j];
    }
  for (; i < x.size(); ++i) {
    lane[0] = x[i] > lane[0] ? x[i] : lane[0];
    nan_lane[0] = x[i] != x[i] ? 1.0f : nan_lane[0];
  }
  float m = lane[0];
  *any_nan = false;
  for (size_t j = 0; j < kLanes; ++j) {
    m = lane[j] > m ? lane[j] : m;
    *any_nan |= nan_lane[j] != 0.0f;
  }
  return m;
}

}  // namespace

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  bool any_nan = false;
  const float max_logit = max_of(logits, &any_nan);
  // exp(x - max) in [0, 1] to ~2e-7 each, summed in float blocks and then in double: log_z to a
  // few 1e-7 (the logprobs are floats).
  const double sum = std::isfinite(max_logit) ? sum_exp(logits, max_logit) : 0.0;
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
    // The `top` best in one pass: larger logit first, ties to the lower id, NaN as -inf. `best`
    // stays sorted; a candidate enters only when it beats the last of a full list.
    auto value = [&](int32_t i) { return std::isnan(logits[i]) ? kNegInf : logits[i]; };
    auto better = [&](int32_t a, int32_t b) {
      const float la = value(a), lb = value(b);
      return la != lb ? la > lb : a < b;
    };
    std::vector<int32_t> best;
    best.reserve(static_cast<size_t>(top) + 1);
    float worst = kNegInf;  // the last kept value once the list is full
    const int32_t n = static_cast<int32_t>(logits.size());
    for (int32_t i = 0; i < n; ++i) {
      // Ids come in increasing order, so an equal value never beats a kept one (ties to the lower
      // id), and a NaN (false against everything) never does either. With the list full, a block
      // of kLanes values none of which beats the last kept one is passed over at once.
      if (static_cast<int>(best.size()) == top) {
        while (i % static_cast<int32_t>(kLanes) == 0 && i + static_cast<int32_t>(kLanes) <= n) {
          bool any = false;
          for (size_t j = 0; j < kLanes; ++j) any |= logits[i + j] > worst;
          if (any) break;
          i += static_cast<int32_t>(kLanes);
        }
        if (i >= n) break;
        if (!(logits[i] > worst)) continue;
      }
      best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
      if (static_cast<int>(best.size()) > top) best.pop_back();
      if (static_cast<int>(best.size()) == top) worst = value(best.back());
    }
    for (int32_t id : best) out.top.push_back(TopLogprob{id, logprob_of(id)});
  }
  return out;
}

int32_t sample_with_bans(std::span<const float> logits, const SamplingParams& params, int64_t position,
                         std::span<const int32_t> history, size_t n_prompt, std::span<const int32_t> banned,
                         std::span<const uint32_t> allowed) {
  std::vector<float> masked(logits.begin(), logits.end());
  sampling::apply_token_mask(masked, allowed);
  for (int32_t t : banned)
    if (t >= 0 && static_cast<size_t>(t) < masked.size()) masked[t] = -std::numeric_limits<float>::infinity();
  if (std::none_of(masked.begin(), masked.end(), [](float x) { return x > -std::numeric_limits<float>::infinity(); }))
    return -1;
  n_prompt = std::min(n_prompt, history.size());
  return sampling::sample_token(masked, params, position, sampling::TokenHistory{history.first(n_prompt), history.subspan(n_prompt)});
}

}  // namespace megadecode
