// The v1 megakernel's agents (SimLoader::kV1), following mk_producer.cuh and megakernel.cuh's
// consumer_loop: the producer waits on each task's counters itself, prefetching weight pages of
// later static GEMM tasks into free ring slots meanwhile (never past an expert drain), claims
// drain items from queues, and posts work records the consumers run in order.
#include "plan/simulate_agents.h"

namespace megadecode::sim {
namespace {

const std::vector<SimTask>& list_of(const Step& st, const SmState& s) { return st.e.plan.lists[s.sm]; }

// The weight part of page k: one bulk copy, issue_us of the producer's time.
Co issue_weights(Step& st, SmState& s, int64_t bytes, int64_t k) {
  st.e.issue(s.sm, page_size(bytes, st.e.params.page_bytes, k), false, true);
  co_await st.e.delay(s.loader, st.e.params.issue_us);
}

// The activation part of a page (mk_gemm.cuh issue_activations): issue_us, plus a dependent load
// of each row's index when gathered. (One bulk copy per row: only batch-1 traces calibrate it, so
// the rows' copies are counted as one.)
Co issue_activations(Step& st, SmState& s, int rows, bool gathered) {
  co_await st.e.delay(s.loader, st.e.params.issue_us + (gathered ? rows * st.e.params.claim_rtt_us : 0.0));
  ++s.x_seq;
}

// Issues weight pages of upcoming static GEMM tasks while slots are free (never waits for one).
// want_slot: it stopped for want of a slot (a release may let it go on).
Co prefetch_some(Step& st, SmState& s, bool& want_slot) {
  want_slot = false;
  const auto& list = list_of(st, s);
  while (s.pf_task < static_cast<int>(list.size())) {
    const SimTask& t = list[s.pf_task];
    if (t.cls == SimClass::kRouted) co_return;  // its pages are unknown until an item is claimed
    if (t.cls != SimClass::kGemm || s.pf_page >= n_pages(t.bytes, st.e.params.page_bytes)) {
      ++s.pf_task;
      s.pf_page = 0;
      continue;
    }
    if (!st.e.slot_free(s.sm)) {
      want_slot = true;
      co_return;
    }
    co_await issue_weights(st, s, t.bytes, s.pf_page++);
  }
}

// Polls counter >= target, prefetching meanwhile (Producer::wait_counter).
Co wait_prefetching(Step& st, SmState& s, SimWait w) {
  const double t0 = st.e.now();
  for (;;) {
    bool want_slot = false;
    co_await prefetch_some(st, s, want_slot);
    const double seen = st.e.seen_or_register(w, t0, nullptr);
    if (seen <= st.e.now()) break;
    if (seen < kNever) st.e.wake_at(seen, s.loader);
    else st.e.seen_or_register(w, t0, &s.loader);
    if (want_slot) st.e.on_slot(s.sm, s.loader);
    co_await st.e.block(s.loader, "a counter");
  }
  if (st.e.now() > t0) s.waits.push_back({t0, st.e.now()});
}

Co post(Step& st, SmState& s, Work w) {
  while (static_cast<int64_t>(s.works.size()) >= s.works_released + st.e.params.work_slots) {
    s.loader_waits_for_release = true;
    co_await st.e.block(s.loader, "a free work slot");
  }
  s.works.push_back(w);
  if (s.consumer_waits_for_post) {
    s.consumer_waits_for_post = false;
    st.e.wake_at(st.e.now(), s.consumer);
  }
}

void release_work(Step& st, SmState& s) {
  ++s.works_released;
  if (s.loader_waits_for_release) {
    s.loader_waits_for_release = false;
    st.e.wake_at(st.e.now(), s.loader);
  }
}

// Waits until the consumers released the last posted work, prefetching meanwhile.
Co wait_last_released(Step& st, SmState& s) {
  while (s.works_released < static_cast<int64_t>(s.works.size())) {
    bool want_slot = false;
    co_await prefetch_some(st, s, want_slot);
    if (s.works_released >= static_cast<int64_t>(s.works.size())) break;
    if (want_slot) st.e.on_slot(s.sm, s.loader);
    s.loader_waits_for_release = true;
    co_await st.e.block(s.loader, "the last attention item");
  }
}

Co wait_slot(Step& st, SmState& s) {
  while (!st.e.slot_free(s.sm)) {
    st.e.on_slot(s.sm, s.loader);
    co_await st.e.block(s.loader, "a free ring slot");
  }
}

// Posts a GEMM work whose first pages_w pages are already issued, then issues the rest as slots
// free up (Producer::stream_job).
Co stream_job(Step& st, SmState& s, Work w, int64_t bytes, int64_t pages_w, bool static_task) {
  co_await post(st, s, w);
  const int rows = w.item ? w.item->x_rows : w.task->x_rows;
  const bool gathered = w.item && w.item->gathered;
  for (int64_t k = 0, n = n_pages(bytes, st.e.params.page_bytes); k < n; ++k) {
    if (k >= pages_w) {
      co_await wait_slot(st, s);
      co_await issue_weights(st, s, bytes, k);
      if (static_task) ++s.pf_page;
    }
    co_await issue_activations(st, s, rows, gathered);
  }
}

Co claim(Step& st, SmState& s, const SimTask& t, int64_t& index) {
  index = st.queue_head[t.queue]++;  // the atomic decides the order; its data comes back later
  co_await st.e.delay(s.loader, st.e.params.claim_rtt_us * st.e.plan.queues[t.queue].claim_round_trips);
}

Co drain_attention(Step& st, SmState& s, const SimTask& t) {
  const SimQueue& q = st.e.plan.queues[t.queue];
  for (int posted = 0;; ++posted) {
    if (q.one_at_a_time && posted > 0) co_await wait_last_released(st, s);
    int64_t i = 0;
    co_await claim(st, s, t, i);
    if (i >= static_cast<int64_t>(q.items.size())) co_return;
    const SimItem& item = q.items[i];
    if (!q.consumer_waits)
      for (const SimWait& w : item.waits) co_await wait_prefetching(st, s, w);
    co_await post(st, s, Work{Work::kItem, &t, &item, q.one_at_a_time, q.consumer_waits});
  }
}

Co drain_experts(Step& st, SmState& s, const SimTask& t) {
  const SimQueue& q = st.e.plan.queues[t.queue];
  const int64_t slots = st.e.params.ring_pages;
  co_await st.e.delay(s.loader, st.e.params.claim_rtt_us * q.prologue_round_trips);
  for (;;) {
    int64_t i = 0;
    co_await claim(st, s, t, i);
    if (i >= static_cast<int64_t>(q.items.size())) co_return;
    const SimItem& item = q.items[i];
    const int64_t n = n_pages(item.bytes, st.e.params.page_bytes);
    int64_t pages_w = 0;
    // Weights first, into slots whose previous page already has its activation part issued.
    while (q.weights_before_wait && pages_w < n) {
      const int64_t w_seq = st.e.ring_issued(s.sm);
      if (!(w_seq < slots || w_seq - slots < s.x_seq)) break;
      co_await wait_slot(st, s);
      co_await issue_weights(st, s, item.bytes, pages_w++);
    }
    for (const SimWait& w : item.waits) co_await wait_prefetching(st, s, w);
    co_await stream_job(st, s, Work{Work::kItem, &t, &item, false, false}, item.bytes, pages_w, false);
  }
}

}  // namespace

Co producer_v1(Step& st, SmState& s) {
  const auto& list = list_of(st, s);
  for (int cur = 0; cur < static_cast<int>(list.size()); ++cur) {
    if (s.pf_task < cur) {
      s.pf_task = cur;
      s.pf_page = 0;
    }
    const SimTask& t = list[cur];
    for (const SimWait& w : t.waits) co_await wait_prefetching(st, s, w);
    if (t.queue >= 0) {
      if (t.cls == SimClass::kAttention) co_await drain_attention(st, s, t);
      else co_await drain_experts(st, s, t);
      if (!t.arrives.empty()) co_await post(st, s, Work{Work::kArriveOnly, &t, nullptr, false, false});
      if (s.pf_task <= cur) {
        s.pf_task = cur + 1;
        s.pf_page = 0;
      }
      continue;
    }
    const Work w{Work::kTask, &t, nullptr, false, false};
    if (t.cls == SimClass::kGemm) {
      const int64_t pages_w = s.pf_task > cur ? n_pages(t.bytes, st.e.params.page_bytes) : s.pf_page;
      co_await stream_job(st, s, w, t.bytes, pages_w, s.pf_task == cur);
    } else {
      co_await post(st, s, w);
    }
  }
  co_await post(st, s, Work{Work::kEnd, nullptr, nullptr, false, false});
}

Co consumer_v1(Step& st, SmState& s) {
  for (size_t i = 0;; ++i) {
    while (s.works.size() <= i) {
      s.consumer_waits_for_post = true;
      co_await st.e.block(s.consumer, "a work record");
    }
    const Work w = s.works[i];
    if (!w.release_late) release_work(st, s);
    if (w.kind == Work::kEnd) co_return;
    if (w.kind != Work::kArriveOnly) co_await st.e.delay(s.consumer, st.e.params.pickup_us);
    const double t0 = st.e.now();
    if (w.kind == Work::kTask) {
      co_await st.e.delay(s.consumer, w.task->cost_us);
      co_await consume(st, s, w.task->bytes);
      arrive_all(st, w.task->arrives);
    } else if (w.kind == Work::kItem) {
      if (w.consumer_waits)
        for (const SimWait& x : w.item->waits) co_await st.e.wait_counter(s.consumer, x, nullptr);
      co_await run_item(st, s, *w.item);
    } else {
      arrive_all(st, w.task->arrives);
    }
    if (w.kind != Work::kArriveOnly)
      s.slices.push_back({static_cast<int>(w.task->op), w.task->layer, t0, st.e.now()});
    if (w.release_late) release_work(st, s);
  }
}

}  // namespace megadecode::sim
