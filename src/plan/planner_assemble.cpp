// The planner's assembly: places the step's attention items and merges them into the skeleton's
// static segments, giving the per-SM lists, the waves, the counter totals and the attention items'
// dynamic arrivals (for the validator and the emulator's end-of-step checks).
#include <algorithm>
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

void assemble_plan(const PlanSkeleton& sk, const std::vector<AttnItem>& items, const std::vector<int>& rel_sm,
                   Plan& plan) {
  const PlanShape& s = sk.shape;
  const CounterLayout& c = sk.counters;
  const int n_sms = s.n_sms, n_layers = s.n_layers, n_pairs = s.batch * s.n_kv_heads;
  const int n_items = static_cast<int>(items.size());
  MD_CHECK(rel_sm.size() == items.size());

  // The items of each relative SM, in item order.
  std::vector<int32_t> rel_begin(n_sms + 1, 0), rel_items(n_items);
  for (int i = 0; i < n_items; ++i) ++rel_begin[rel_sm[i] + 1];
  std::partial_sum(rel_begin.begin(), rel_begin.end(), rel_begin.begin());
  {
    std::vector<int32_t> fill(rel_begin.begin(), rel_begin.end() - 1);
    for (int i = 0; i < n_items; ++i) rel_items[fill[rel_sm[i]]++] = i;
  }
  // Each (seq, group) pair's items, in every layer: pair_begin[q] .. pair_begin[q + 1].
  std::vector<int32_t> pair_begin(n_pairs + 1, 0);
  for (const AttnItem& it : items) ++pair_begin[it.seq * s.n_kv_heads + it.group + 1];
  std::partial_sum(pair_begin.begin(), pair_begin.end(), pair_begin.begin());
  // by_pair[L * n_items + pair_begin[q] + j]: the task of the j-th item of pair q in layer L (as
  // SMs are walked in order, each pair's tasks come in ascending task order).
  std::vector<int32_t> by_pair(static_cast<size_t>(n_layers) * n_items);
  std::vector<int32_t> pair_fill(static_cast<size_t>(n_layers) * n_pairs);
  for (int L = 0; L < n_layers; ++L)
    std::copy(pair_begin.begin(), pair_begin.end() - 1, pair_fill.begin() + static_cast<size_t>(L) * n_pairs);

  const size_t total = sk.static_tasks.size() + static_cast<size_t>(n_layers) * n_items;
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
        // The wave after layer k-1's ATTN waits on every attention task.
        for (size_t j = t; j < t + (b - a); ++j)
          if (plan.task_wave[j] == sk.attn_wave[k - 1] + 1) plan.tasks[j].wait[0].target = n_items;
      }
      t += b - a;
      if (k == n_layers) break;
      const int r = ((m - sk.attn_cursor[k]) % n_sms + n_sms) % n_sms;
      for (int32_t j = rel_begin[r]; j < rel_begin[r + 1]; ++j) {
        const int i = rel_items[j];
        plan.tasks[t] = attention_task(sk, k, i, items[i].group);
        plan.task_wave[t] = sk.attn_wave[k];
        const int q = items[i].seq * s.n_kv_heads + items[i].group;
        by_pair[static_cast<size_t>(k) * n_items + pair_fill[static_cast<size_t>(k) * n_pairs + q]++] =
            static_cast<int32_t>(t);
        ++t;
      }
    }
  }
  plan.list_begin[n_sms] = static_cast<int32_t>(t);
  MD_CHECK(t == total);

  plan.waves = sk.waves;
  for (int L = 0; L < n_layers; ++L) plan.waves[sk.attn_wave[L]].n_tasks = n_items;
  plan.counters = sk.counter_info;
  if (s.grid_sync)
    for (int L = 0; L < n_layers; ++L) plan.counters[c.wave_done + sk.attn_wave[L]].total += n_items;

  // The attention items' arrivals: each (seq, g)'s splits count into its split counter, and the
  // last of them arrives on attn_done.
  plan.dynamic_arrivals.clear();
  plan.dynamic_arrivals.reserve(static_cast<size_t>(n_layers) * (n_pairs + 1));
  for (int L = 0; L < n_layers; ++L) {
    const int32_t* layer_tasks = by_pair.data() + static_cast<size_t>(L) * n_items;
    for (int q = 0; q < n_pairs; ++q) {
      const int32_t ctr = layer_counter(c, L, c.attn_split + q);
      const int n = pair_begin[q + 1] - pair_begin[q];
      plan.dynamic_arrivals.push_back({ctr, n, std::vector<int32_t>(layer_tasks + pair_begin[q], layer_tasks + pair_begin[q + 1])});
      plan.counters[ctr].total += n;
    }
    const int32_t done = layer_counter(c, L, c.attn_done);
    plan.dynamic_arrivals.push_back({done, n_pairs, std::vector<int32_t>(layer_tasks, layer_tasks + n_items)});
    plan.counters[done].total += n_pairs;
  }
}

}  // namespace megadecode
