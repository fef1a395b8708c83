#include "model/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/check.h"

namespace megadecode {

void RoutingLog::record(int64_t seq, int pos, std::span<const int32_t> experts, std::span<const float> weights) {
  const size_t n = static_cast<size_t>(n_layers_) * top_k_;
  MD_REQUIRE(experts.size() == n && weights.size() == n, "routing log: a token's routing is ", n_layers_, " layers x ",
             top_k_, " experts, got ", experts.size(), " experts and ", weights.size(), " weights");
  TokenRouting& t = tokens_[{seq, pos}];
  t.experts.assign(experts.begin(), experts.end());
  t.weights.assign(weights.begin(), weights.end());
}

const TokenRouting* RoutingLog::find(int64_t seq, int pos) const {
  const auto it = tokens_.find({seq, pos});
  return it == tokens_.end() ? nullptr : &it->second;
}

double RoutingAudit::max_gap() const {
  double g = 0;
  for (const RouteDiff& d : diffs) g = std::max(g, d.gap);
  return g;
}

std::vector<RouteDiff> RoutingAudit::beyond(double near_tie) const {
  std::vector<RouteDiff> out;
  for (const RouteDiff& d : diffs)
    if (!(d.gap < near_tie)) out.push_back(d);
  return out;
}

std::string RoutingAudit::summary() const {
  std::ostringstream s;
  s << n_forced << " routing decisions forced, " << diffs.size() << " differ from the reference's own";
  if (!diffs.empty()) {
    const auto worst = std::max_element(diffs.begin(), diffs.end(),
                                        [](const RouteDiff& a, const RouteDiff& b) { return a.gap < b.gap; });
    s << " (largest tie gap " << worst->gap << " at seq " << worst->seq << " pos " << worst->pos << " layer "
      << worst->layer << ")";
  }
  return s.str();
}

double forced_route_gap(std::span<const float> scores, std::span<const int32_t> forced, bool* differs) {
  const int n = static_cast<int>(scores.size()), k = static_cast<int>(forced.size());
  MD_REQUIRE(k >= 1 && k <= n, "forced routing: ", k, " experts of ", n);
  std::vector<char> in_forced(n, 0);
  for (int32_t e : forced) {
    MD_REQUIRE(e >= 0 && e < n, "forced routing: expert ", e, " outside [0, ", n, ")");
    MD_REQUIRE(!in_forced[e], "forced routing: expert ", e, " given twice");
    in_forced[e] = 1;
  }
  // The reference's own top-k: larger first, ties to the lower id (ref/math.h top_k's rule).
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return scores[a] > scores[b]; });
  float dropped = -INFINITY, added = INFINITY;  // largest own expert not forced, smallest forced not own
  std::vector<char> own(n, 0);
  for (int j = 0; j < k; ++j) own[idx[j]] = 1;
  for (int e = 0; e < n; ++e) {
    if (own[e] && !in_forced[e]) dropped = std::max(dropped, scores[e]);
    if (!own[e] && in_forced[e]) added = std::min(added, scores[e]);
  }
  *differs = dropped != -INFINITY;
  if (!*differs) return 0.0;
  const double pk = scores[idx[k - 1]];
  return (static_cast<double>(dropped) - added) / std::max(std::fabs(pk), 1e-30);
}

}  // namespace megadecode
