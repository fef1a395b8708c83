// MoE routing as data, for comparisons that must be routing-exact: a RoutingLog holds, per
// processed token (sequence id, position) and layer, the K chosen experts and their weights. The
// CUDA backends fill one when capture is on (a test/debug switch, nothing runs when off); cpu-ref
// takes one as a forced routing (it then uses those experts, weighted by its own router
// probabilities) and reports, in a RoutingAudit, every (token, layer) where its own choice would
// have differed, with how close to a tie that choice was.
//
// Why: random-weight routers have near-ties between the K-th and (K+1)-th expert, and bf16 vs fp32
// rounding flips them with no bug anywhere; one flipped expert moves a row's logits by 10-20 %. A
// flip where the reference's gap is NOT a near-tie is a real bug; with the device's routing forced
// on the reference every row must then meet the plain tolerance.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace megadecode {

// One token's routing in every layer: experts[layer * top_k + k] in the order the router ranked
// them (descending probability), weights alike (normalised when the model says so).
struct TokenRouting {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

class RoutingLog {
 public:
  RoutingLog() = default;
  RoutingLog(int n_layers, int top_k) : n_layers_(n_layers), top_k_(top_k) {}

  int n_layers() const { return n_layers_; }
  int top_k() const { return top_k_; }
  size_t size() const { return tokens_.size(); }
  void clear() { tokens_.clear(); }

  // Records (or replaces) the routing of sequence `seq`'s token at `pos`: [n_layers * top_k] each.
  void record(int64_t seq, int pos, std::span<const int32_t> experts, std::span<const float> weights);
  // Nullptr when the token was not recorded.
  const TokenRouting* find(int64_t seq, int pos) const;
  const std::map<std::pair<int64_t, int>, TokenRouting>& tokens() const { return tokens_; }

 private:
  int n_layers_ = 0;
  int top_k_ = 0;
  std::map<std::pair<int64_t, int>, TokenRouting> tokens_;
};

// A (token, layer) where a forced routing differs from the reference's own top-k.
struct RouteDiff {
  int64_t seq = 0;
  int pos = 0;
  int layer = 0;
  // The reference's tie gap there: (largest probability of an expert the forced set drops minus the
  // smallest of one it adds) / the reference's K-th probability. For one swap at the boundary that is
  // (p_K - p_K+1) / p_K. A near-tie is a gap below kRouteNearTie.
  double gap = 0;
};

// What a forced run saw: how many (token, layer) routing decisions it forced, and where the forced
// experts were not the reference's own choice.
struct RoutingAudit {
  int64_t n_forced = 0;
  std::vector<RouteDiff> diffs;

  double max_gap() const;
  // Diffs whose gap is not below `near_tie` (real routing bugs when the reference shares the
  // device's rounding points).
  std::vector<RouteDiff> beyond(double near_tie) const;
  std::string summary() const;  // "N forced, M differ (largest gap G at seq S pos P layer L)"
};

// The relative tie gap (RouteDiff::gap) of forcing `forced` (K distinct experts) on a token whose
// reference probabilities (or scores, any order-preserving value) are `scores`; 0 when the forced
// set is the reference's own top-K set (ties broken to the lower id). Error for a forced expert
// outside [0, n_experts) or repeated.
double forced_route_gap(std::span<const float> scores, std::span<const int32_t> forced, bool* differs);

// Near-tie bounds of the routing-exact tests: a flip whose reference gap is below the bound may be
// rounding, one above it is a bug.
//  - kRouteNearTie (5e-3 of the K-th probability): the two sides round at the same points (the
//    decode megakernel against cpu-ref with the device's rounding points): only summation order
//    and the attention arithmetic differ, but those move a bf16 norm output by an ulp now and
//    then, and a few such flips move a router logit by ~1e-3. Measured on the H200: v1 0 of 328
//    decisions differ; v2 2 of 164 (gaps 2.0e-4 and 1.56e-3, batch 64, position 848, every row
//    within 0.0032 once forced). A wrong input or index flips decisions at gaps spread over
//    (0, 1): the bound keeps 99.5 % of them.
//  - kRouteNearTieMixed (2e-2): the two sides round at different points: an fp32 reference (cpu-ref
//    by default, transformers in fp32) against the device's bf16 norm outputs, or the prefill path
//    (bf16 q and P in its flash attention, as transformers in bf16) against cpu-ref's device
//    rounding. Measured: cpu-ref fp32 forced with cpu-ref device-rounding's routing, small preset,
//    a 1,500-token prompt: 80 of 3,000 decisions differ, gaps 2.8e-5 .. 8.6e-3; on the H200,
//    transformers vs cuda-mk 15 of 686 (largest 6.0e-3), prefill vs cpu-ref 32 of 2,002 (3.8e-3)
//    (docs/perf/journal/2026-12.md).
inline constexpr double kRouteNearTie = 5e-3;
inline constexpr double kRouteNearTieMixed = 2e-2;

}  // namespace megadecode
