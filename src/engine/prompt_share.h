// How many prompt tokens a mixed step carries: as many as keep the decoding streams'
// inter-token latency within `ratio` x that of a step without prompt tokens, from what the steps
// measured. Two running estimates (exponential averages): the plain step's time t0 (a step of
// decode rows alone) and the added time per prompt token s (a mixed step's excess over t0 divided
// by its prompt tokens). The share is (ratio - 1) t0 / s, clamped to [min_tokens, max_tokens];
// before both are measured it is `initial`. Plain C++; the scheduler owns one.
#pragma once

#include <algorithm>
#include <cmath>

namespace megadecode {

class PromptShare {
 public:
  struct Params {
    double ratio = 1.6;    // the bound on a mixed step's time over a plain step's (> 1)
    int min_tokens = 16;   // a prompt always advances by at least this much (capped by max_tokens)
    int initial = 64;      // before the first estimates
    double weight = 0.25;  // of a new sample in the averages
  };
  explicit PromptShare(const Params& p) : p_(p) {}

  // The prompt tokens the next mixed step may carry, at most max_tokens (>= 1).
  int tokens(int max_tokens) const {
    int n = p_.initial;
    if (t0_ > 0.0 && s_ > 0.0) {
      const double share = (p_.ratio - 1.0) * t0_ / s_;
      n = share >= 1e9 ? 1000000000 : static_cast<int>(std::floor(share));
    }
    n = std::max(n, p_.min_tokens);
    return std::clamp(n, 1, std::max(1, max_tokens));
  }
  // A step of decode rows alone took `seconds`.
  void plain_step(double seconds) { t0_ = average(t0_, seconds); }
  // A step of decode rows and `prompt_tokens` prompt tokens took `seconds`. Ignored before a plain
  // step is measured (no baseline); a step no slower than the baseline counts as a tiny cost.
  void mixed_step(double seconds, int prompt_tokens) {
    if (t0_ <= 0.0 || prompt_tokens <= 0) return;
    const double per_token = std::max(seconds - t0_, t0_ * 1e-6) / prompt_tokens;
    s_ = average(s_, per_token);
  }
  double seconds_per_token() const { return s_; }

 private:
  double average(double old, double sample) const {
    return old <= 0.0 ? sample : old + p_.weight * (sample - old);
  }
  Params p_;
  double t0_ = 0.0, s_ = 0.0;
};

}  // namespace megadecode
