// The megakernel's loader (warp 8: lane 0 issues, the whole warp walks). It walks the SM's task list
// in order and streams the weight pages of every GEMM job into the page ring, one bulk copy per page
// (evict-first), as soon as a slot is free: it never waits on a counter for a page, so the next
// tasks' weights land while the consumers wait for activations. At a layer's first routed task it
// waits for the layer's router tiles and computes the routing itself (routing.cuh, the whole warp),
// hands the tables to the consumers (route_bar) and streams the experts' pages at once, wherever
// the consumers are: on an SM busy with an attention item they land during it. With kMkL2Prefetch
// it prefetches its later static tiles' weights into L2 (evict-last) before that wait (off by
// default: measured slower on the H200, docs/perf/journal/2026-12.md). Job geometry: the
// consumers' (ops.cuh JobWalk, plan/gemm_geometry.h page loops), so both walk one page sequence.
#pragma once

#include <cstdint>

#include "cuda/megakernel/ops.cuh"

namespace megadecode::cuda::mk {

constexpr int64_t kL2AheadBytes = 192 << 10;  // per SM: 132 x 192 KiB = 25 MiB of the 60 MB L2

__device__ __forceinline__ void bulk_prefetch_l2_keep(const void* src, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(src), "r"(bytes), "l"(policy)
               : "memory");
}

template <int kNT>
struct Loader {
  const MkParams& p;
  Ring ring;
  RouteSmem& route;
  uint64_t* route_bar;  // the loader arrives once per routing it computed (release of the tables)
  const volatile int32_t* consumer_task;  // kMkLoaderInOrder: the task the consumers are on
  uint64_t evict_first, evict_last;
  uint32_t w_seq = 0;     // pages issued
  uint32_t slot = 0, phase = 0;  // the next slot to fill; phase of its next completion
  uint32_t l_seq = 0, l_slot = 0, l_phase = 0;  // the cap's oldest page not seen landed
  int routed_layer = -1;
  int cur_task = 0;       // the task the walk is at (trace records)
  int l2_next = 0;        // the first task the L2 prefetch has not covered

  // The next slot is free (its previous page consumed by all 8 consumer warps) and fewer pages
  // than the cap (flags.h mk_inflight_cap: one by default) are issued and not landed. (The oldest
  // such page's slot holds it until it is consumed, and the cap is below the ring's length, so its
  // full barrier is at that page's phase.)
  // (A cap of the ring's length or more is no cap: the slot wait bounds the pages in flight.)
  // (The switches kMkExpertsUncapped / kMkDownUncapped lift it for the task's pages: uncapped_task;
  // kMkExpertsUncappedLate once the consumers are on the task: uncapped_late.)
  bool uncapped_task = false, uncapped_late = false;
  __device__ uint32_t inflight_cap() const {
    const bool lifted = uncapped_task || (uncapped_late && *consumer_task >= cur_task);
    const uint32_t cap = lifted ? 0u : mk_inflight_cap(p.flags);
    return cap < static_cast<uint32_t>(ring.n_slots) ? cap : 0u;
  }
  __device__ bool slot_ready() {
    const uint32_t cap = inflight_cap();
    return (cap == 0 || w_seq - l_seq < cap || mbar_test_wait(&ring.full[l_slot], l_phase)) &&
           (w_seq < static_cast<uint32_t>(ring.n_slots) || mbar_test_wait(&ring.empty[slot], phase ^ 1u));
  }
  __device__ bool wait_slot() {
    TraceClock clock;  // (a wait that blocked, for the trace)
    clock.start_loader(p, p.trace != nullptr && !slot_ready());
    const bool ok = wait_slot_untimed();
    clock.stop_loader(p, p.tasks[cur_task], cur_task, kLoaderSlotWait);
    return ok;
  }
  __device__ bool wait_slot_untimed() {
    const uint32_t cap = inflight_cap();
    // Pages issued while the cap was lifted (kMkExpertsUncapped...) were not followed: every page
    // more than a ring behind has had its slot refilled, so it landed (and was consumed). The oldest
    // page to follow is then the one in the next slot (its full barrier one phase behind `phase`).
    if (cap != 0 && w_seq - l_seq > static_cast<uint32_t>(ring.n_slots)) {
      l_seq = w_seq - static_cast<uint32_t>(ring.n_slots);
      l_slot = slot;
      l_phase = phase ^ 1u;
    }
    while (cap != 0 && w_seq - l_seq >= cap) {
      if (!mbar_wait_bounded(p, &ring.full[l_slot], l_phase, 300 + static_cast<int>(l_slot))) return false;
      ++l_seq;
      if (++l_slot == static_cast<uint32_t>(ring.n_slots)) {
        l_slot = 0;
        l_phase ^= 1u;
      }
    }
    if (w_seq < static_cast<uint32_t>(ring.n_slots)) return true;
    return mbar_wait_bounded(p, &ring.empty[slot], phase ^ 1u, 200 + static_cast<int>(slot));
  }

  // Every page of the job, in the consumers' order (gemm.cuh consume_job's two loops).
  __device__ bool issue_job(const GemmGeo& g, const GemmJob& j) {
    const uint32_t per = static_cast<uint32_t>(g.page_kb) * kTileBytes;
    return walk_pages(g, j.rb_end - j.rb_begin, [&](int32_t rb0, int32_t nrb, int32_t kb0) {
      if (!wait_slot()) return false;
      if ((threadIdx.x & 31) == 0) {
        const uint16_t* group = j.w + tile_offset(j.rb_begin + rb0, g.n_kb, 0);
        uint8_t* page = ring.pages + static_cast<size_t>(slot) * kPageBytes;
        ptx::mbar_arrive_expect_tx(&ring.full[slot], nrb * per);
        if (g.page_kb == g.n_kb) {  // whole rows: one contiguous range
          ptx::bulk_g2s(page, group, nrb * per, &ring.full[slot], evict_first);
        } else {
          for (int m = 0; m < nrb; ++m)
            ptx::bulk_g2s(page + m * per, group + tile_offset(m, g.n_kb, kb0), per, &ring.full[slot], evict_first);
        }
      }
      ++w_seq;
      if (++slot == static_cast<uint32_t>(ring.n_slots)) {
        slot = 0;
        phase ^= 1u;
      }
      return true;
    });
  }

  // Later static tiles' weights into L2, up to kL2AheadBytes ahead of task `cur`.
  __device__ void prefetch_l2(int cur, int end) {
    if (!(p.flags & kMkL2Prefetch)) return;
    int64_t budget = kL2AheadBytes;
    int j = l2_next > cur ? l2_next : cur + 1;
    for (; j < end && budget > 0; ++j) {
      const Task t = p.tasks[j];
      const Op op = static_cast<Op>(t.op);
      if (op != Op::kQkv && op != Op::kOProj && op != Op::kRouter && op != Op::kLmHead) continue;
      const int32_t n_kb = p.geo[gemm_kind(op)].n_kb;
      const uint8_t* a = reinterpret_cast<const uint8_t*>(tile_matrix(p, t) + tile_offset(t.arg[0], n_kb, 0));
      const int64_t all = static_cast<int64_t>(t.arg[1] - t.arg[0]) * n_kb * kTileBytes;
      const int64_t take = all < budget ? all : budget;
      for (int64_t off = 0; off < take; off += 1 << 20)
        bulk_prefetch_l2_keep(a + off, static_cast<uint32_t>(take - off < (1 << 20) ? take - off : (1 << 20)), evict_last);
      budget -= take;
    }
    l2_next = j;
  }

  // The layer's routing, at the layer's first routed task `cur` of the launch: the whole warp waits
  // for the router tiles, computes the tables and hands them to the consumers. The task is an
  // expert-up share, whose last wait is the router tiles' (ops.cuh op_gemm), or, in a launch of one
  // wave (cuda-ops), an expert-down share, whose waits (every up share) come after them. The
  // consumers finished with the previous layer's tables before the router tiles could finish (their
  // inputs come after this SM's last routed task of that layer: validator check_routing_order), so
  // one set of tables is enough and the consumers never see two routings' arrivals at once.
  __device__ bool route_layer(int cur, int end) {
    const Task& t = p.tasks[cur];  // (from the list: no local copy)
    const int layer = t.layer;
    const int lane = threadIdx.x & 31;
    const bool up = static_cast<Op>(t.op) == Op::kExpertUp;
    if (t.n_waits < 1) {
      if (lane == 0) set_error(p, kMkBadShape, -1, t.op, t.n_waits, cur, kMkDetailUnknownOp);
      return false;
    }
    if (lane == 0) prefetch_l2(cur, end);
    bool ok = true;
    TraceClock clock;
    clock.start_loader(p);
    if (lane == 0)
      for (int k = up ? t.n_waits - 1 : 0; k < t.n_waits && ok; ++k)
        ok = wait_counter_quiet(p, p.tasks[cur].wait[k].counter, p.tasks[cur].wait[k].target, cur);
    clock.stop_loader(p, t, cur, kLoaderRouterWait);
    ok = __shfl_sync(0xffffffffu, ok, 0);
    __syncwarp();  // memory order among the lanes: lane 0's acquire is handed on
    if (!ok) return false;
    clock.start_loader(p);
    if (!compute_routing(p, layer, route)) {
      if (lane == 0) set_error(p, kMkBadInput, -1, layer, p.plan.shape.n_experts, cur, -2);
      return false;
    }
    clock.stop_loader(p, t, cur, kLoaderRouting);
    if (lane == 0) ptx::mbar_arrive(route_bar);  // release: the tables (the warp met in compute_routing)
    routed_layer = layer;
    return true;
  }

  __device__ bool wait_consumers(int task) {
    const int64_t t0 = globaltimer_ns();
    for (uint32_t spin = 0; *consumer_task < task; ++spin)
      if ((spin & 63) == 63 && (step_failed(p) || globaltimer_ns() - t0 > 3 * p.timeout_ns + 1000000000ll)) return false;
    return true;
  }

  // An attention item's metadata into L1 (the item, its sequence's length and the block-table line
  // of its first keys: the item's first loads hit L1 instead of three dependent L2 round trips) and,
  // with kMkKvPrefetch, its K and V rows into L2 (the item then reads L2, not HBM, after its QKV
  // wait). The consumers check the item; a bad one is skipped here.
  __device__ void prefetch_attn(const Task& t) {
    const PlanShape& s = p.plan.shape;
    const BufferLayout& b = p.plan.buffers;
    if (t.arg[0] < 0 || t.arg[0] >= s.n_attn_items) return;
    const AttnItem it = buf<const AttnItem>(p, b.attn_items)[t.arg[0]];
    if (!attn_item_in_range(s, it)) return;
    if (t.flags & kAttnSliding) {  // a sliding layer's item: its rows are in the ring (AttnGeo::ring_len)
      prefetch_attn_ring(t, it);
      return;
    }
    const int sb = log2_pow2(s.kv_block_size);
    const int32_t* bt = buf<const int32_t>(p, b.block_tables) + static_cast<int64_t>(it.seq) * s.max_blocks_per_seq;
    ptx::prefetch_l1(buf<const int32_t>(p, b.seq_len) + it.seq);
    ptx::prefetch_l1(bt + (it.pos_begin >> sb));
    const int32_t full_layer = s.sliding_window == 0 ? t.layer : p.w.layers[t.layer].kv_full_index;
    if (!(p.flags & kMkKvPrefetch) || full_layer < 0) return;  // the consumers refuse an item without a slice
    const uint32_t block_bytes = static_cast<uint32_t>(s.kv_block_size * s.head_dim * 2);  // one group's rows of a block
    const uint16_t* kc = p.kv + static_cast<int64_t>(full_layer) * p.kv_layer_stride;
    for (int blk = it.pos_begin >> sb; blk <= (it.pos_end - 1) >> sb; ++blk) {
      const int64_t at = (static_cast<int64_t>(bt[blk]) * s.n_kv_heads + it.group) * s.kv_block_size * s.head_dim;
      ptx::bulk_prefetch_l2(kc + at, block_bytes);
      ptx::bulk_prefetch_l2(kc + p.kv_v_offset + at, block_bytes);
    }
  }

  // prefetch_attn of a sliding layer's item: the same lines through its ring table (block
  // (pos / bs) % ring_len of the ring pool). The consumers check the item's window and ring
  // layer; one they would refuse is skipped here.
  __device__ void prefetch_attn_ring(const Task& t, const AttnItem& it) {
    const PlanShape& s = p.plan.shape;
    const BufferLayout& b = p.plan.buffers;
    const int32_t ring_layer = p.w.layers[t.layer].kv_ring_index;
    if (ring_layer < 0 || p.kv_ring == nullptr || s.ring_len <= 0) return;
    const int sb = log2_pow2(s.kv_block_size);
    const int32_t* rt = buf<const int32_t>(p, b.ring_tables) + static_cast<int64_t>(it.seq) * s.ring_len;
    ptx::prefetch_l1(buf<const int32_t>(p, b.seq_len) + it.seq);
    ptx::prefetch_l1(rt + (it.pos_begin >> sb) % s.ring_len);
    if (!(p.flags & kMkKvPrefetch) || it.pos_end - it.pos_begin > s.sliding_window) return;
    const uint32_t block_bytes = static_cast<uint32_t>(s.kv_block_size * s.head_dim * 2);
    const uint16_t* kc = p.kv_ring + static_cast<int64_t>(ring_layer) * p.kv_ring_layer_stride;
    for (int blk = it.pos_begin >> sb; blk <= (it.pos_end - 1) >> sb; ++blk) {
      const int32_t phys = rt[blk % s.ring_len];
      if (phys < 0) return;  // a table shorter than the item (the consumers report it)
      const int64_t at = (static_cast<int64_t>(phys) * s.n_kv_heads + it.group) * s.kv_block_size * s.head_dim;
      ptx::bulk_prefetch_l2(kc + at, block_bytes);
      ptx::bulk_prefetch_l2(kc + p.kv_ring_v_offset + at, block_bytes);
    }
  }

  __device__ bool run(int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const Task t = p.tasks[i];
      const Op op = static_cast<Op>(t.op);
      cur_task = i;
      if ((p.flags & kMkLoaderInOrder) && !wait_consumers(i)) return false;
      if (!megakernel_runs(op)) {  // the consumers refuse it too: stream nothing for it or after it
        if ((threadIdx.x & 31) == 0) set_error(p, kMkBadShape, -1, t.op, kNumOps, i, kMkDetailUnknownOp);
        return false;
      }
      // Attention items load their K/V themselves; SAMPLE reads no weights.
      if (op == Op::kAttn && (threadIdx.x & 31) == 0) prefetch_attn(t);
      if (op == Op::kAttn || op == Op::kSample) continue;
      if (op_is_routed(op) && routed_layer != t.layer && !route_layer(i, end)) return false;
      uncapped_task = ((p.flags & kMkExpertsUncapped) && (op == Op::kExpertUp || op == Op::kExpertDown)) ||
                      ((p.flags & kMkDownUncapped) && op == Op::kExpertDown);
      uncapped_late = (p.flags & kMkExpertsUncappedLate) && (op == Op::kExpertUp || op == Op::kExpertDown);
      JobWalk walk;  // the consumers' job sequence (ops.cuh)
      walk.start(p, t, route);
      const GemmGeo& g = p.geo[walk.kind];
      TaskJob tj;
      while (walk.template next<kNT>(p, t, route, tj))
        if (!issue_job(g, tj.job)) return false;
    }
    return true;
  }

  // After a failure: let every page in flight land so no bulk copy is outstanding when the CTA
  // exits (the consumers may have stopped consuming).
  __device__ void drain() {
    const uint32_t first = w_seq > static_cast<uint32_t>(ring.n_slots) ? w_seq - ring.n_slots : 0;
    for (uint32_t q = first; q < w_seq; ++q) {  // (once, after a failure: the divisions do not matter)
      const int64_t t0 = globaltimer_ns();
      while (!ptx::mbar_try_wait(&ring.full[q % ring.n_slots], (q / ring.n_slots) & 1))
        if (globaltimer_ns() - t0 > 1000000000ll) break;
    }
  }
};

}  // namespace megadecode::cuda::mk
