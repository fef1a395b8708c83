// The megakernel's agents (simulate.h): the loader issues the pages of the SM's tasks in list order
// (GEMM weights, routed shares) whenever a ring slot is free; at a layer's first routed task it
// prefetches its own later static tasks' bytes into L2 (up to l2_ahead_bytes, read from L2 later),
// waits for the task's last wait (the router tiles) and computes the layer's routing, then streams
// on. The consumers wait on the counters themselves, and for the loader's routing at a routed task.
#include "plan/simulate_agents.h"

#include <algorithm>
#include <span>

#include "core/rng.h"

namespace megadecode::sim {
namespace {

int64_t task_bytes(const SimTask& t) {
  int64_t b = t.bytes;
  for (const SimItem& it : t.items) b += it.bytes;
  return b;
}

// The routing gap: later static tasks' bytes into L2, in list order, up to the budget.
void prefetch_l2(Step& st, SmState& s, int from) {
  const auto& list = st.e.plan.lists[s.sm];
  for (int j = from; j < static_cast<int>(list.size()); ++j) {
    const int64_t budget = st.e.params.l2_ahead_bytes - s.l2_pending;
    if (budget <= 0) return;
    if (list[j].cls != SimClass::kGemm && list[j].cls != SimClass::kAttention) continue;
    const int64_t take = std::min(budget, task_bytes(list[j]) - s.l2_ahead[j]);
    if (take <= 0) continue;
    st.e.issue(s.sm, take, 0, false);
    s.l2_ahead[j] += take;
    s.l2_pending += take;
  }
}

// Issues `bytes` of task j starting at byte `offset` of the task, page by page as slots free up;
// the part prefetched into L2 (the task's first l2_ahead[j] bytes, which may end inside a page) is
// read from there.
Co stream(Step& st, SmState& s, int j, int64_t offset, int64_t bytes) {
  const int64_t page = st.e.params.page_bytes;
  for (int64_t k = 0, n = n_pages(bytes, page); k < n; ++k) {
    while (!st.e.slot_free(s.sm)) {
      st.e.on_slot(s.sm, s.loader);
      co_await st.e.block(s.loader, "a free ring slot");
    }
    const int64_t b = page_size(bytes, page, k);
    const int64_t in_l2 = std::clamp<int64_t>(s.l2_ahead[j] - (offset + k * page), 0, b);
    s.l2_pending -= in_l2;
    st.e.issue(s.sm, b, in_l2, true);
  }
}

// The SM's scatter after a wait that blocked (SimParams::wait_jitter_us), draw `draw` of the SM.
double jitter(const Step& st, const SmState& s, int draw) {
  const double j_us = st.e.params.wait_jitter_us;
  if (j_us <= 0) return 0;
  const float u = uniform_at(st.e.params.routing_seed, static_cast<uint64_t>(s.sm), static_cast<uint64_t>(draw));
  return j_us * 0.5 * (static_cast<double>(u) + 1.0);
}

// Waits `waits` in order. When one blocked (the counter was not there at the first look: the
// kernel's trace records only those), the work starts at its end plus the SM's scatter, which
// *t0 gets; otherwise *t0 stays the task's start.
Co wait_all(Step& st, SmState& s, std::span<const SimWait> waits, int draw, double* t0) {
  const size_t before = s.waits.size();
  for (const SimWait& w : waits) co_await st.e.wait_counter(s.consumer, w, &s.waits);
  if (s.waits.size() == before) co_return;
  co_await st.e.delay(s.consumer, jitter(st, s, draw));
  *t0 = st.e.now();
}

void wake_consumer(Step& st, SmState& s) {
  if (!s.consumer_waits_for_routing) return;
  s.consumer_waits_for_routing = false;
  st.e.wake_at(st.e.now(), s.consumer);
}

}  // namespace

Co loader(Step& st, SmState& s) {
  const auto& list = st.e.plan.lists[s.sm];
  for (int j = 0; j < static_cast<int>(list.size()); ++j) {
    const SimTask& t = list[j];
    if (t.cls == SimClass::kRouted && !s.routed[t.layer]) {
      // (The first routed task of the layer on the SM computes its routing: check_plan.)
      prefetch_l2(st, s, j + 1);
      co_await st.e.wait_counter(s.loader, t.waits.back(), nullptr);
      co_await st.e.delay(s.loader, st.e.params.routing_us * t.routing_rounds +
                                        st.e.params.routing_token_us * (t.routing_rows - 1));
      s.routed[t.layer] = 1;
      wake_consumer(st, s);
    }
    co_await stream(st, s, j, 0, t.bytes);
    int64_t offset = t.bytes;
    for (const SimItem& it : t.items) {
      co_await stream(st, s, j, offset, it.bytes);
      offset += it.bytes;
    }
  }
}

// A work slice runs from the task's start (or its item's), or from the end of a wait that blocked
// it, to its end: the kernel's trace records the same (layer_timeline.h trace_work_slices).
Co consumer(Step& st, SmState& s) {
  const auto& list = st.e.plan.lists[s.sm];
  for (int j = 0; j < static_cast<int>(list.size()); ++j) {
    const SimTask& t = list[j];
    // Attention items are work slices of their own (as in a trace).
    const bool item_slices = t.cls == SimClass::kAttention && !t.items.empty();
    co_await st.e.delay(s.consumer, st.e.params.pickup_us);
    double t0 = st.e.now();
    const std::span<const SimWait> waits(t.waits);
    const size_t first = std::min(waits.size(), static_cast<size_t>(std::max(0, t.pre_after_waits)));
    co_await wait_all(st, s, waits.first(first), j * 64, &t0);
    co_await st.e.delay(s.consumer, t.pre_us);
    if (t.computes_routing) {  // its last wait is the loader's: the consumers take the routing instead
      co_await wait_all(st, s, waits.subspan(first, waits.size() - first - 1), j * 64 + 63, &t0);
      while (!s.routed[t.layer]) {
        s.consumer_waits_for_routing = true;
        co_await st.e.block(s.consumer, "the loader's routing");
      }
    } else {
      co_await wait_all(st, s, waits.subspan(first), j * 64 + 63, &t0);
    }
    co_await st.e.delay(s.consumer, t.cost_us);
    co_await consume(st, s, t.bytes);
    for (size_t k = 0; k < t.items.size(); ++k) {
      const SimItem& it = t.items[k];
      double i0 = st.e.now();
      co_await st.e.delay(s.consumer, it.pre_us);
      co_await wait_all(st, s, it.waits, j * 64 + 1 + static_cast<int>(k % 63), &i0);
      co_await run_item(st, s, it);
      if (item_slices) s.slices.push_back({static_cast<int>(t.op), t.layer, i0, st.e.now()});
    }
    arrive_all(st, t.arrives);
    if (!item_slices) s.slices.push_back({static_cast<int>(t.op), t.layer, t0, st.e.now()});
  }
}

}  // namespace megadecode::sim
