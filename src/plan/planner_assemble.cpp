// The planner's assembly: places the step's attention items and merges them into the skeleton's
// static segments, giving the per-SM lists, the waves, the counter totals and the attention items'
// dynamic arrivals (for the validator and the emulator's end-of-step checks).
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>

#include "core/check.h"
#include "plan/planner_internal.h"

namespace megadecode {

std::vector<int> place_attention(const std::vector<AttnItem>& items, int n_sms) {
  std::vector<int> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  auto len = [&](int i) { return items[i].pos_end - items[i].pos_begin; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len(a) > len(b); });
  // (load, relative SM): the least loaded first, ties to the lowest relative index.
  using Slot = std::pair<int64_t, int>;
  std::vector<Slot> slots(static_cast<size_t>(n_sms));
  for (int k = 0; k < n_sms; ++k) slots[k] = {0, k};
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> heap(std::greater<Slot>(), std::move(slots));
  std::vector<int> rel(items.size());
  for (int i : order) {
    const auto [load, k] = heap.top();
    heap.pop();
    rel[i] = k;
    heap.push({load + len(i), k});
  }
  return rel;
}

std::vector<int> place_attention_sets(const std::vector<AttnItem>& items, int n_full, int n_sms) {
  if (n_full == static_cast<int>(items.size())) return place_attention(items, n_sms);
  std::vector<int> rel = place_attention(std::vector<AttnItem>(items.begin(), items.begin() + n_full), n_sms);
  const std::vector<int> sliding = place_attention(std::vector<AttnItem>(items.begin() + n_full, items.end()), n_sms);
  rel.insert(rel.end(), sliding.begin(), sliding.end());
  return rel;
}

namespace {

// One set of attention items (the full layers' or the sliding layers'), items [begin, end).
struct ItemSet {
  int begin = 0, end = 0;
  std::vector<int32_t> rel_begin, rel_items;  // the set's items of each relative SM, in item order
  std::vector<int32_t> pair_begin;            // [n_pairs + 1] each (seq, group) pair's items, set-relative
  int size() const { return end - begin; }
};

ItemSet item_set(const std::vector<AttnItem>& items, const std::vector<int>& rel_sm, int begin, int end, int n_sms,
                 int n_pairs, int n_kv_heads) {
  ItemSet set;
  set.begin = begin;
  set.end = end;
  set.rel_begin.assign(n_sms + 1, 0);
  set.rel_items.resize(end - begin);
  for (int i = begin; i < end; ++i) ++set.rel_begin[rel_sm[i] + 1];
  std::partial_sum(set.rel_begin.begin(), set.rel_begin.end(), set.rel_begin.begin());
  std::vector<int32_t> fill(set.rel_begin.begin(), set.rel_begin.end() - 1);
  for (int i = begin; i < end; ++i) set.rel_items[fill[rel_sm[i]]++] = i;
  set.pair_begin.assign(n_pairs + 1, 0);
  for (int i = begin; i < end; ++i) ++set.pair_begin[items[i].seq * n_kv_heads + items[i].group + 1];
  std::partial_sum(set.pair_begin.begin(), set.pair_begin.end(), set.pair_begin.begin());
  return set;
}

// Parallel blocks: weights the expert-up shares of every routed layer (args a0, a1, T:
// plan/moe_split.h) so that they end together. An SM whose list holds attention items of the layer
// runs them before its up share (the other SMs start theirs when the routing is known); its items'
// key positions count as delta = positions / tokens_per_unit up units ahead of it. With U the
// expected units of the layer (every expert's units at the expected number of active experts of
// random routing, plus the shared experts'), a share's part is avg + mean(delta) - delta (avg =
// U / SMs), within [avg / 10, 3 avg] (one SM's stream bounds how much it can take), as integer weights. The split changes which SM computes a
// unit, not how: the step's bits do not depend on it. An SM's positions count in whole
// kBalanceQuantum (under one unit of work): the weights, and with them the task lists, stay the
// same while the contexts grow token by token, so decode steps of a sliding-window model (whose
// lists are reassembled every step) upload no new lists most steps.
constexpr int64_t kBalanceQuantum = 64;

void balance_up_shares(const PlanSkeleton& sk, const std::vector<AttnItem>& items, const ItemSet (&sets)[2],
                       Plan& plan) {
  const PlanShape& s = sk.shape;
  const int n_sms = s.n_sms;
  const double per_unit = sk.up_balance_tokens_per_unit;
  if (per_unit <= 0) return;
  const double E = s.n_experts, K = s.top_k;
  const double active = E * (1.0 - std::pow(1.0 - K / E, s.batch));
  const double avg = (active * s.up_units + s.shared_units) / n_sms;
  // [layer][sm]: the SM's up share task (-1: none, a dense layer)
  std::vector<int32_t> up(static_cast<size_t>(s.n_layers) * n_sms, -1);
  for (int m = 0; m < n_sms; ++m)
    for (int32_t i = plan.list_begin[m]; i < plan.list_begin[m + 1]; ++i)
      if (plan.tasks[i].op == static_cast<uint8_t>(Op::kExpertUp))
        up[static_cast<size_t>(plan.tasks[i].layer) * n_sms + m] = i;
  std::vector<double> delta(n_sms);
  for (int L = 0; L < s.n_layers; ++L) {
    if (up[static_cast<size_t>(L) * n_sms] < 0) continue;
    const ItemSet& set = sets[(sk.attn_flags[L] & kAttnSliding) ? 1 : 0];
    double mean = 0;
    for (int m = 0; m < n_sms; ++m) {
      const int r = ((m - sk.attn_cursor[L]) % n_sms + n_sms) % n_sms;
      int64_t positions = 0;
      for (int32_t j = set.rel_begin[r]; j < set.rel_begin[r + 1]; ++j)
        positions += items[set.rel_items[j]].pos_end - items[set.rel_items[j]].pos_begin;
      delta[m] = static_cast<double>(positions / kBalanceQuantum * kBalanceQuantum) / per_unit;
      mean += delta[m] / n_sms;
    }
    int32_t at = 0;
    for (int m = 0; m < n_sms; ++m) {
      const double part = std::clamp(avg + mean - delta[m], 0.1 * avg, 3.0 * avg);
      const int32_t w = std::max<int32_t>(1, static_cast<int32_t>(std::lround(1000.0 * part / avg)));
      Task& t = plan.tasks[up[static_cast<size_t>(L) * n_sms + m]];
      MD_CHECK(t.arg[0] == m && t.arg[1] == m + 1 && t.arg[2] == n_sms, "an up share the skeleton did not deal");
      t.arg[0] = at;
      at += w;
      t.arg[1] = at;
    }
    for (int m = 0; m < n_sms; ++m) plan.tasks[up[static_cast<size_t>(L) * n_sms + m]].arg[2] = at;
  }
}

}  // namespace

void assemble_plan(const PlanSkeleton& sk, const std::vector<AttnItem>& items, int n_full_items,
                   const std::vector<int>& rel_sm, Plan& plan) {
  const PlanShape& s = sk.shape;
  const CounterLayout& c = sk.counters;
  const int n_sms = s.n_sms, n_layers = s.n_layers, n_pairs = s.batch * s.n_kv_heads;
  const int n_items = static_cast<int>(items.size());
  MD_CHECK(rel_sm.size() == items.size());
  // Full layers run items [0, n_full), sliding layers [n_full, n_items) (qwen3_moe: every item is full).
  const int n_full = s.parallel ? n_full_items : n_items;
  MD_CHECK(n_full >= 0 && n_full <= n_items);
  const ItemSet sets[2] = {item_set(items, rel_sm, 0, n_full, n_sms, n_pairs, s.n_kv_heads),
                           item_set(items, rel_sm, n_full, n_items, n_sms, n_pairs, s.n_kv_heads)};
  auto set_of = [&](int L) -> const ItemSet& { return sets[(sk.attn_flags[L] & kAttnSliding) ? 1 : 0]; };
  // by_pair[layer_base[L] + pair_begin[q] + j]: the task of the j-th item of pair q in layer L (as
  // SMs are walked in order, each pair's tasks come in ascending task order).
  std::vector<size_t> layer_base(n_layers + 1, 0);
  for (int L = 0; L < n_layers; ++L) layer_base[L + 1] = layer_base[L] + set_of(L).size();
  std::vector<int32_t> by_pair(layer_base[n_layers]);
  std::vector<int32_t> pair_fill(static_cast<size_t>(n_layers) * n_pairs);
  for (int L = 0; L < n_layers; ++L)
    std::copy(set_of(L).pair_begin.begin(), set_of(L).pair_begin.end() - 1,
              pair_fill.begin() + static_cast<size_t>(L) * n_pairs);

  const size_t total = sk.static_tasks.size() + layer_base[n_layers];
  plan.tasks.resize(total);
  plan.task_wave.resize(total);
  plan.list_begin.assign(n_sms + 1, 0);
  size_t t = 0;
  for (int m = 0; m < n_sms; ++m) {
    plan.list_begin[m] = static_cast<int32_t>(t);
    for (int k = 0; k <= n_layers; ++k) {
      const size_t seg = static_cast<size_t>(m) * (n_layers + 1) + k;
      const int32_t a = sk.seg_begin[seg], b = sk.seg_begin[seg + 1];
      std::copy(sk.static_tasks.begin() + a, sk.static_tasks.begin() + b, plan.tasks.begin() + t);
      std::copy(sk.static_wave.begin() + a, sk.static_wave.begin() + b, plan.task_wave.begin() + t);
      if (s.grid_sync && k > 0) {
        // The wave after layer k-1's ATTN waits on every attention task of that layer.
        for (size_t j = t; j < t + (b - a); ++j)
          if (plan.task_wave[j] == sk.attn_wave[k - 1] + 1) plan.tasks[j].wait[0].target = set_of(k - 1).size();
      }
      t += b - a;
      if (k == n_layers) break;
      const ItemSet& set = set_of(k);
      const int r = ((m - sk.attn_cursor[k]) % n_sms + n_sms) % n_sms;
      for (int32_t j = set.rel_begin[r]; j < set.rel_begin[r + 1]; ++j) {
        const int i = set.rel_items[j];
        plan.tasks[t] = attention_task(sk, k, i, items[i].group);
        plan.task_wave[t] = sk.attn_wave[k];
        const int q = items[i].seq * s.n_kv_heads + items[i].group;
        by_pair[layer_base[k] + pair_fill[static_cast<size_t>(k) * n_pairs + q]++] = static_cast<int32_t>(t);
        ++t;
      }
    }
  }
  plan.list_begin[n_sms] = static_cast<int32_t>(t);
  MD_CHECK(t == total);
  balance_up_shares(sk, items, sets, plan);

  plan.waves = sk.waves;
  for (int L = 0; L < n_layers; ++L) plan.waves[sk.attn_wave[L]].n_tasks = set_of(L).size();
  plan.counters = sk.counter_info;
  if (s.grid_sync)
    for (int L = 0; L < n_layers; ++L) plan.counters[c.wave_done + sk.attn_wave[L]].total += set_of(L).size();

  // The attention items' arrivals: each (seq, g)'s splits count into its split counter, and the
  // last of them arrives on attn_done.
  plan.dynamic_arrivals.clear();
  plan.dynamic_arrivals.reserve(static_cast<size_t>(n_layers) * (n_pairs + 1));
  for (int L = 0; L < n_layers; ++L) {
    const ItemSet& set = set_of(L);
    const int32_t* layer_tasks = by_pair.data() + layer_base[L];
    for (int q = 0; q < n_pairs; ++q) {
      const int32_t ctr = layer_counter(c, L, c.attn_split + q);
      const int n = set.pair_begin[q + 1] - set.pair_begin[q];
      plan.dynamic_arrivals.push_back(
          {ctr, n, std::vector<int32_t>(layer_tasks + set.pair_begin[q], layer_tasks + set.pair_begin[q + 1])});
      plan.counters[ctr].total += n;
    }
    const int32_t done = layer_counter(c, L, c.attn_done);
    plan.dynamic_arrivals.push_back({done, n_pairs, std::vector<int32_t>(layer_tasks, layer_tasks + set.size())});
    plan.counters[done].total += n_pairs;
  }
}

}  // namespace megadecode
