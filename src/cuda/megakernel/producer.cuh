// The producer of the megakernel (warp 8, lane 0): controller, waiter and loader in one thread.
// It walks the SM's task list in order; for each task it acquires the task's counters, claims
// queue items for drain tasks, and hands the consumers one Work record per task or item. For GEMM
// work it streams pages: the WEIGHT part of a page is issued as soon as a ring slot is free —
// including for later tasks while it polls an earlier task's counters (prefetch_some) — and the
// ACTIVATION part only after the work's counters are acquired (+ fence.proxy.async.global).
//
// Page order = the order the consumers consume: pages are W-issued (w_seq) and X-issued (x_seq)
// strictly in sequence, and prefetch never passes an expert drain task (its pages are unknown
// until an item is claimed), so a page's slot is reused only after the consumers released the
// page that held it. Blocking on a slot is done only when that slot's previous page already has
// its activation part issued (it will complete and be released): no cycle through this CTA.
#pragma once

#include <cstdint>

#include "cuda/megakernel/gemm.cuh"
#include "cuda/megakernel/tile_ops.cuh"

namespace megadecode::cuda::mk {

constexpr int kMaxPages = 16;
// How far the L2 look-ahead (kMkL2Lookahead) runs ahead of the current task, in weight bytes per
// SM: 132 SMs x 256 KiB = 33 MiB, two thirds of the H200's 50 MiB L2.
constexpr int64_t kL2LookaheadBytes = 256 << 10;
constexpr int kWorkSlots = 4;
constexpr int kWorkArriveOnly = -3;  // a drain task's own arrivals, after all its items

template <int kNT>
struct Producer {
  using M = MkTile<kNT>;
  const MkParams& p;
  uint8_t* pages;
  int n_slots;
  uint64_t* full;
  uint64_t* empty;
  Work* works;
  uint64_t* wfull;
  uint64_t* wempty;
  uint64_t policy;
  int list_end;
  uint32_t w_seq = 0, x_seq = 0, work_seq = 0;
  int pf_task = 0, pf_page = 0;
  int cur_task = 0;        // the task run() is on
  int l2_task = 0;         // the next task the L2 look-ahead considers
  int64_t l2_ahead = 0;    // weight bytes it prefetched for tasks after cur_task

  __device__ Producer(const MkParams& params, uint8_t* pg, int slots, uint64_t* f, uint64_t* e, Work* w,
                      uint64_t* wf, uint64_t* we)
      : p(params), pages(pg), n_slots(slots), full(f), empty(e), works(w), wfull(wf), wempty(we) {
    policy = ptx::policy_evict_first();
  }

  __device__ uint8_t* page_of(uint32_t seq) const { return pages + (seq % n_slots) * M::kPageBytes; }
  __device__ bool slot_free(uint32_t seq) const {
    return seq < static_cast<uint32_t>(n_slots) ||
           mbar_test_wait(&empty[seq % n_slots], ((seq / n_slots) & 1) ^ 1);
  }
  __device__ bool wait_slot(uint32_t seq) const {
    return seq < static_cast<uint32_t>(n_slots) ||
           mbar_wait_bounded(p, &empty[seq % n_slots], ((seq / n_slots) & 1) ^ 1, 200 + static_cast<int>(seq % n_slots));
  }
  __device__ void issue_w(const GemmJob& j, int pg) {
    issue_weights<kNT>(j, pg, page_of(w_seq), &full[w_seq % n_slots], policy);
    ++w_seq;
  }
  __device__ void issue_x(const GemmJob& j, int pg) {
    issue_activations<kNT>(j, pg, page_of(x_seq), &full[x_seq % n_slots]);
    ++x_seq;
  }

  // The GEMM geometry of a static task; false for every other op.
  __device__ bool static_job(const Task& t, GemmJob& j, Work& wk) const {
    const PlanShape& s = p.plan.shape;
    const BufferLayout& b = p.plan.buffers;
    const Op op = static_cast<Op>(t.op);
    int row0, row1;
    j.gather = nullptr;
    j.n_tokens = s.batch;
    j.kb_off = 0;
    wk.y_tok_base = 0;
    switch (op) {
      case Op::kQkv: {
        const int base = t.arg[0] * s.qkv_group_rows;
        row0 = base + t.arg[1];
        row1 = base + t.arg[2];
        j.w = p.w.layers[t.layer].qkv;
        j.n_kb_total = s.hidden / kPackK;
        j.n_kb = j.n_kb_total;
        j.x = buf<uint16_t>(p, b.xn);
        j.x_stride = s.hidden;
        wk.y = buf<float>(p, b.qkv);
        wk.y_stride = s.n_kv_heads * s.qkv_group_rows;
        break;
      }
      case Op::kOProj: {
        const int kq = s.group_size * s.head_dim;
        row0 = t.arg[1];
        row1 = t.arg[2];
        j.w = p.w.layers[t.layer].o_proj;
        j.n_kb_total = s.n_heads * s.head_dim / kPackK;
        j.kb_off = t.arg[0] * kq / kPackK;
        j.n_kb = kq / kPackK;
        j.x = buf<uint16_t>(p, b.attn_out);
        j.x_stride = s.n_heads * s.head_dim;
        wk.y = buf<float>(p, b.o_part) + static_cast<int64_t>(t.arg[0]) * s.batch * s.hidden;
        wk.y_stride = s.hidden;
        break;
      }
      case Op::kRouter:
      case Op::kLmHead: {
        const bool router = op == Op::kRouter;
        row0 = t.arg[0];
        row1 = t.arg[1];
        j.w = router ? p.w.layers[t.layer].router : p.w.lm_head;
        j.n_kb_total = s.hidden / kPackK;
        j.n_kb = j.n_kb_total;
        j.x = buf<uint16_t>(p, router ? b.hn : b.xf);
        j.x_stride = s.hidden;
        wk.y = buf<float>(p, router ? b.router_logits : b.logits);
        wk.y_stride = router ? s.n_experts : s.vocab;
        break;
      }
      default:
        return false;
    }
    j.rb_begin = row0 / kPackRows;
    j.rb_end = (row1 + kPackRows - 1) / kPackRows;
    wk.row_end = row1;
    return true;
  }

  // Issues weight parts of upcoming static GEMM pages while slots are free (never blocks).
  __device__ void prefetch_some() {
    if (p.flags & kMkNoPrefetch) return;  // ablation: weights only after the activation wait
    while (pf_task < list_end) {
      const Task& t = p.tasks[pf_task];
      const Op op = static_cast<Op>(t.op);
      if (op == Op::kExpertUp || op == Op::kExpertDown) return;
      GemmJob j;
      Work wk;
      if (!static_job(t, j, wk)) {
        ++pf_task;
        pf_page = 0;
        continue;
      }
      if (pf_page >= job_pages<kNT>(j.rb_begin, j.rb_end, j.n_kb)) {
        ++pf_task;
        pf_page = 0;
        continue;
      }
      if (!slot_free(w_seq)) return;
      issue_w(j, pf_page++);
    }
  }

  // Weight bytes of a static GEMM task (0 for any other), and with `issue` their L2 prefetch: one
  // bulk prefetch per row block run (a row block's k tiles are contiguous; whole-K jobs are one run).
  __device__ int64_t l2_prefetch_task(const Task& t, bool issue) const {
    GemmJob j;
    Work wk;
    if (!static_job(t, j, wk)) return 0;
    const int64_t tile_elems = kPackRows * kPackK;
    const int64_t run_bytes = static_cast<int64_t>(j.n_kb) * kPackTileBytes;
    if (issue) {
      if (j.n_kb == j.n_kb_total) {
        const uint16_t* a = j.w + static_cast<int64_t>(j.rb_begin) * j.n_kb_total * tile_elems;
        for (int64_t off = 0, all = run_bytes * (j.rb_end - j.rb_begin); off < all; off += 1 << 20)
          ptx::bulk_prefetch_l2(reinterpret_cast<const uint8_t*>(a) + off, static_cast<uint32_t>(min(all - off, int64_t(1) << 20)));
      } else {
        for (int rb = j.rb_begin; rb < j.rb_end; ++rb)
          ptx::bulk_prefetch_l2(j.w + (static_cast<int64_t>(rb) * j.n_kb_total + j.kb_off) * tile_elems,
                                static_cast<uint32_t>(run_bytes));
      }
    }
    return run_bytes * (j.rb_end - j.rb_begin);
  }

  // Runs the L2 cursor ahead of the shared-memory prefetch, past expert and attention drains,
  // until kL2LookaheadBytes of later static tasks' weights are on their way into L2 (a hint: the
  // page loads that follow hit L2 instead of HBM; nothing depends on it for correctness).
  __device__ void l2_lookahead() {
    if (!(p.flags & kMkL2Lookahead)) return;
    if (l2_task <= pf_task) {  // the shared-memory prefetch caught up: start after it
      l2_task = pf_task + 1;
      l2_ahead = 0;
    }
    while (l2_task < list_end && l2_ahead < kL2LookaheadBytes) l2_ahead += l2_prefetch_task(p.tasks[l2_task++], true);
  }

  // run() moved on to task `cur`: what the look-ahead counted for it is no longer ahead.
  __device__ void l2_advance(int cur) {
    cur_task = cur;
    if ((p.flags & kMkL2Lookahead) && cur < l2_task) l2_ahead = max(int64_t(0), l2_ahead - l2_prefetch_task(p.tasks[cur], false));
  }

  // Polls counter >= target, prefetching weights meanwhile. Bounded; acquire on success.
  __device__ bool wait_counter(int32_t counter, int32_t target, int32_t task) {
    const int32_t* c = counter_ptr(p, counter);
    if (ld_relaxed_gpu(c) >= target) {
      fence_acquire_gpu();
      return true;
    }
    const int64_t t0 = globaltimer_ns();
    const int64_t c0 = p.trace ? trace_clock() : 0;
    const int32_t first_seen = p.trace ? ld_relaxed_gpu(c) : 0;
    uint32_t sleep_ns = 32;
    for (uint32_t spin = 0;; ++spin) {
      prefetch_some();
      if (spin == 0) l2_lookahead();
      const int32_t v = ld_relaxed_gpu(c);
      if (v >= target) break;
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < 256 ? sleep_ns * 2 : 256;
      if ((spin & 15) == 15) {
        if (step_failed(p)) return false;
        if (globaltimer_ns() - t0 > p.timeout_ns) {
          set_error(p, kMkWaitTimeout, counter, ld_relaxed_gpu(c), target, task, -1);
          return false;
        }
      }
    }
    fence_acquire_gpu();
    if (p.trace) trace_wait(counter, target, task, first_seen, t0, c0);
    return true;
  }

  // Trace hook (trace.h): one record per wait that had to poll.
  __device__ void trace_wait(int32_t counter, int32_t target, int32_t task, int32_t first_seen, int64_t g0,
                             int64_t c0) const {
    TraceRecord r{};
    r.g_begin = g0;
    r.c_begin = c0;
    r.c_end = trace_clock();
    r.g_end = trace_gtime();
    r.kind = kTraceWait;
    r.op = task >= 0 ? p.tasks[task].op : -1;
    r.layer = task >= 0 ? p.tasks[task].layer : -1;
    r.task = task;
    r.arg0 = counter;
    r.arg1 = target;
    r.arg2 = first_seen;
    trace_put(p.trace, p.trace_counts, p.trace_capacity, 1, r);
  }

  // The next queue index this drain task works on: claimed with one atomic (work stealing), or
  // under kMkStaticQueues the fixed sequence sm, sm + S, sm + 2S, ... (every SM runs exactly one
  // drain task per drain wave, so the sequences partition the queue).
  __device__ int32_t next_item(int32_t* head, int32_t& k) const {
    if (p.flags & kMkStaticQueues) return static_cast<int32_t>(blockIdx.x) + (k++) * static_cast<int32_t>(gridDim.x);
    return atom_add_relaxed_gpu(head, 1);
  }

  __device__ bool post(const Work& wk) {
    const uint32_t slot = work_seq % kWorkSlots;
    if (work_seq >= kWorkSlots &&
        !mbar_wait_bounded(p, &wempty[slot], ((work_seq / kWorkSlots) & 1) ^ 1, 300 + static_cast<int>(slot)))
      return false;
    works[slot] = wk;
    ptx::mbar_arrive(&wfull[slot]);  // release (CTA scope): the record is visible to the consumers
    ++work_seq;
    return true;
  }

  // Streams a GEMM work whose first `pages_w` pages already have their weight parts in flight.
  __device__ bool stream_job(const GemmJob& j, const Work& wk, int pages_w, bool static_task) {
    ptx::fence_proxy_async_global();  // acquired activations are read by bulk copies (async proxy)
    if (!post(wk)) return false;
    const int n = job_pages<kNT>(j.rb_begin, j.rb_end, j.n_kb);
    for (int pg = 0; pg < n; ++pg) {
      if (pg >= pages_w) {
        if (!wait_slot(w_seq)) return false;
        issue_w(j, pg);
        if (static_task) ++pf_page;
      }
      issue_x(j, pg);
    }
    return true;
  }

  __device__ Work base_work(const Task& t, int32_t index) const {
    Work wk{};
    wk.op = t.op;
    wk.layer = t.layer;
    wk.task = index;
    wk.n_arrives = t.n_arrives;
    for (int i = 0; i < t.n_arrives && i < 2; ++i) {
      wk.arrive_counter[i] = t.arrive[i].counter;
      wk.arrive_amount[i] = t.arrive[i].amount;
    }
    for (int i = 0; i < 4; ++i) wk.arg[i] = t.arg[i];
    return wk;
  }

  // Waits (prefetching weights meanwhile) until the consumers released the last posted work;
  // for a tensor-core attention item that is when it is done (megakernel.cuh, consumer_loop).
  __device__ bool wait_last_released(int32_t task) {
    const uint32_t w = work_seq - 1;
    uint64_t* bar = &wempty[w % kWorkSlots];
    const uint32_t parity = (w / kWorkSlots) & 1;
    if (mbar_test_wait(bar, parity)) return true;
    const int64_t t0 = globaltimer_ns();
    for (uint32_t spin = 0;; ++spin) {
      prefetch_some();
      if (mbar_test_wait(bar, parity)) return true;
      __nanosleep(64);
      if ((spin & 15) == 15) {
        if (step_failed(p)) return false;
        // The item may itself wait up to timeout_ns for QKV: the same generous bound as mbarriers.
        if (globaltimer_ns() - t0 > 3 * p.timeout_ns + 1000000000ll) {
          set_error(p, kMkBarrierTimeout, -1, 0, 0, task, 300 + static_cast<int>(w % kWorkSlots));
          return false;
        }
      }
    }
  }

  // Scalar items (default): the producer waits for the item's QKV group, then posts it (up to
  // kWorkSlots items in flight). Tensor-core items are claimed one at a time, the next only when
  // the previous one is done, so the items spread over the SMs that are free; their QKV wait is
  // the consumers' (attention_item.cuh: they stream the item's past K/V while the projection ends).
  __device__ bool drain_attention(const Task& t, int32_t index) {
    const PlanShape& s = p.plan.shape;
    const CounterLayout& c = p.plan.counters;
    const bool tc = p.attn_impl == kMkAttnTc;
    int32_t* head = counter_ptr(p, layer_counter(c, t.layer, c.attn_head));
    const AttnItem* items = buf<const AttnItem>(p, p.plan.buffers.attn_items);
    for (int32_t k = 0, posted = 0;; ++posted) {
      if (tc && posted > 0 && !wait_last_released(index)) return false;
      const int32_t i = next_item(head, k);
      if (i >= s.n_attn_items) return true;
      const AttnItem it = items[i];
      if (it.seq < 0 || it.seq >= s.batch || it.group < 0 || it.group >= s.n_kv_heads) {
        set_error(p, kMkBadItem, -1, it.seq, it.group, index, i);
        return false;
      }
      if (!tc && !wait_counter(layer_counter(c, t.layer, c.qkv_done + it.group), s.qkv_tiles_per_group, index))
        return false;
      Work wk = base_work(t, index);
      wk.n_arrives = 0;  // the item arrives itself (split counter, last-arriver merge)
      wk.arg[0] = i;
      if (!post(wk)) return false;
    }
  }

  __device__ bool drain_experts(const Task& t, int32_t index, bool down) {
    const PlanShape& s = p.plan.shape;
    const BufferLayout& b = p.plan.buffers;
    const CounterLayout& c = p.plan.counters;
    const MkLayerWeights& lw = p.w.layers[t.layer];
    int32_t* head = counter_ptr(p, layer_counter(c, t.layer, down ? c.down_head : c.up_head));
    const int32_t n_items = __ldcg(buf<int32_t>(p, b.moe_n_items) + t.layer * 2 + (down ? 1 : 0));
    const int32_t* items = buf<int32_t>(p, down ? b.down_items : b.up_items);
    const int blocks = down ? s.down_blocks : s.up_blocks;
    for (int32_t k = 0;;) {
      const int32_t i = next_item(head, k);
      if (i >= n_items) return true;
      const int32_t item = __ldcg(items + i);
      const int e = moe_item_expert(item), blk = moe_item_block(item);
      const int32_t off = __ldcg(buf<int32_t>(p, b.expert_offset) + (e < s.n_experts ? e : 0));
      const int32_t cnt = __ldcg(buf<int32_t>(p, b.expert_count) + (e < s.n_experts ? e : 0));
      if (e >= s.n_experts || blk >= blocks || cnt < 1 || cnt > s.batch || off < 0 ||
          off + cnt > s.batch * s.top_k) {
        set_error(p, kMkBadItem, -1, item, cnt, index, i);
        return false;
      }
      GemmJob j;
      Work wk = base_work(t, index);
      wk.arg[0] = e;
      wk.arg[1] = blk;
      wk.n_arrives = 1;
      wk.arrive_amount[0] = 1;
      j.n_tokens = cnt;
      j.kb_off = 0;
      wk.n_tokens = cnt;
      wk.y_tok_base = off;
      int row0, row1;
      if (!down) {
        const int col0 = blk * s.up_cols, col1 = min(s.moe_inter, col0 + s.up_cols);
        row0 = 2 * col0;
        row1 = 2 * col1;
        j.w = lw.experts_up + e * lw.expert_up_elems;
        j.n_kb_total = s.hidden / kPackK;
        j.x = buf<uint16_t>(p, b.hn);
        j.x_stride = s.hidden;
        j.gather = buf<int32_t>(p, b.expert_tokens) + off;
        wk.y = buf<uint16_t>(p, b.act);
        wk.y_stride = s.moe_inter;
        wk.row_end = col1;  // the SwiGLU epilogue compares columns
        wk.arrive_counter[0] = layer_counter(c, t.layer, c.up_done + e);
      } else {
        row0 = blk * s.down_rows;
        row1 = min(s.hidden, row0 + s.down_rows);
        j.w = lw.experts_down + e * lw.expert_down_elems;
        j.n_kb_total = s.moe_inter / kPackK;
        j.x = buf<uint16_t>(p, b.act);
        j.x_stride = s.moe_inter;
        j.gather = nullptr;
        j.x = j.x + static_cast<int64_t>(off) * s.moe_inter;
        wk.y = buf<float>(p, b.down_out);
        wk.y_stride = s.hidden;
        wk.row_end = row1;
        wk.arrive_counter[0] = layer_counter(c, t.layer, c.down_done);
      }
      j.n_kb = j.n_kb_total;
      j.rb_begin = row0 / kPackRows;
      j.rb_end = (row1 + kPackRows - 1) / kPackRows;
      wk.rb_begin = j.rb_begin;
      wk.rb_end = j.rb_end;
      wk.n_kb = j.n_kb;
      // Weights first, into slots whose previous page is already fully issued.
      const int n = job_pages<kNT>(j.rb_begin, j.rb_end, j.n_kb);
      int pages_w = 0;
      while (!(p.flags & kMkNoPrefetch) && pages_w < n && (w_seq < static_cast<uint32_t>(n_slots) || w_seq - n_slots < x_seq)) {
        if (!wait_slot(w_seq)) return false;
        issue_w(j, pages_w++);
      }
      if (down && !wait_counter(layer_counter(c, t.layer, c.up_done + e), s.up_blocks, index)) return false;
      if (!stream_job(j, wk, pages_w, false)) return false;
    }
  }

  __device__ void run(int list_begin, int end) {
    list_end = end;
    pf_task = list_begin;
    pf_page = 0;
    bool ok = true;
    l2_task = list_begin;
    for (int cur = list_begin; ok && cur < end; ++cur) {
      l2_advance(cur);
      if (pf_task < cur) {
        pf_task = cur;
        pf_page = 0;
      }
      const Task t = p.tasks[cur];
      for (int i = 0; ok && i < t.n_waits; ++i) ok = wait_counter(t.wait[i].counter, t.wait[i].target, cur);
      if (!ok) break;
      const Op op = static_cast<Op>(t.op);
      if (op == Op::kAttn || op == Op::kExpertUp || op == Op::kExpertDown) {
        ok = op == Op::kAttn ? drain_attention(t, cur) : drain_experts(t, cur, op == Op::kExpertDown);
        if (ok && t.n_arrives > 0) {
          Work wk = base_work(t, cur);
          wk.op = kWorkArriveOnly;
          ok = post(wk);
        }
        if (pf_task <= cur) {
          pf_task = cur + 1;
          pf_page = 0;
        }
        continue;
      }
      GemmJob j;
      Work wk = base_work(t, cur);
      if (static_job(t, j, wk)) {
        wk.rb_begin = j.rb_begin;
        wk.rb_end = j.rb_end;
        wk.n_kb = j.n_kb;
        wk.n_tokens = j.n_tokens;
        const int n = job_pages<kNT>(j.rb_begin, j.rb_end, j.n_kb);
        const int pages_w = pf_task > cur ? n : pf_page;
        ok = stream_job(j, wk, pages_w, pf_task == cur);
      } else {
        ok = post(wk);
      }
    }
    Work last{};
    last.op = ok ? kWorkEnd : kWorkAbort;
    if (!post(last) || !ok) drain_pages();
  }

  // After a failure: let every page in flight complete (weight-only pages get the arrival their
  // activation part would have brought) so no bulk copy is outstanding when the CTA exits.
  __device__ void drain_pages() {
    for (uint32_t s = x_seq; s < w_seq; ++s) ptx::mbar_arrive(&full[s % n_slots]);
    const uint32_t first = w_seq > static_cast<uint32_t>(n_slots) ? w_seq - n_slots : 0;
    for (uint32_t s = first; s < w_seq; ++s) {
      const int64_t t0 = globaltimer_ns();
      while (!ptx::mbar_try_wait(&full[s % n_slots], (s / n_slots) & 1))
        if (globaltimer_ns() - t0 > 1000000000ll) break;
    }
  }
};

}  // namespace megadecode::cuda::mk
