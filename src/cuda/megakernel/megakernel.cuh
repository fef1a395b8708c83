// The persistent decode megakernel: grid = SM count, one CTA per SM (all resident), 288 threads:
// warps 0..7 consume (math; thread 0 also stores the arrivals), warp 8 lane 0 produces (walks the
// task list, waits, claims queue items, streams pages; producer.cuh). One launch runs the
// tasks [list_begin[s], list_end[s]) of every SM s: the whole step (cuda-mk) or one wave
// (cuda-ops). Shared memory: barriers | work ring | op scratch | page ring.
#pragma once

#include <cstdint>

#include "cuda/megakernel/producer.cuh"  // first: mk_ops.cuh needs mk_gemm.cuh's constants
#include "cuda/megakernel/attention_item.cuh"
#include "cuda/megakernel/sample.cuh"

namespace megadecode::cuda::mk {

constexpr int kBarOffset = 0;      // page full[16], page empty[16], work full[4], work empty[4]
constexpr int kWorkOffset = 512;   // Work[kWorkSlots]
constexpr int kScratchOffset = 1024;

constexpr int cmax(int a, int b) { return a > b ? a : b; }

// The scratch holds the largest op scratch; the tensor-core attention's (~92 KB) only when that
// item is selected (kTcAttn), so the default keeps its page-ring slots. The page ring follows it.
template <int kNT, bool kTcAttn>
struct MkSmem {
  static constexpr int kScratchBytes =
      (cmax(cmax(cmax(MkTile<kNT>::kRedBytes, static_cast<int>(sizeof(AttnScratch))),
                 kTcAttn ? static_cast<int>(sizeof(AttnTcScratch)) : 0),
            cmax(static_cast<int>(sizeof(DispatchScratch)), static_cast<int>(sizeof(SampleScratch)))) +
       127) / 128 * 128;
  static constexpr int kPagesOffset = kScratchOffset + kScratchBytes;
  static constexpr int kPageBytes = MkTile<kNT>::kPageBytes;
};
static_assert(kWorkSlots * sizeof(Work) <= kScratchOffset - kWorkOffset);
static_assert((2 * kMaxPages + 2 * kWorkSlots) * 8 <= kWorkOffset);

// What the consumers of one CTA share.
struct ConsumerCtx {
  const MkParams& p;
  uint8_t* pages;
  int n_slots;
  uint64_t* full;
  uint64_t* empty;
  uint8_t* scratch;
  uint32_t page_seq;
};

// One function per op, same signature; the dispatch below is generated from MD_OPS.
template <int kNT, bool kTc> __device__ bool run_attn_norm(ConsumerCtx& c, const Work& w) { return op_attn_norm(c.p, w, reinterpret_cast<float*>(c.scratch)); }
template <int kNT, bool kTc> __device__ bool run_moe_norm(ConsumerCtx& c, const Work& w) { return op_moe_norm(c.p, w, reinterpret_cast<float*>(c.scratch)); }
template <int kNT, bool kTc> __device__ bool run_final_norm(ConsumerCtx& c, const Work& w) { return op_final_norm(c.p, w, reinterpret_cast<float*>(c.scratch)); }
// The attention item is chosen at compile time (kTc: the kernel instantiated for
// MkParams::attn_impl == kMkAttnTc), so the default kernel carries no tensor-core code.
template <int kNT, bool kTc> __device__ bool run_attn(ConsumerCtx& c, const Work& w) {
  if constexpr (kTc) return op_attn_tc(c.p, w, *reinterpret_cast<AttnTcScratch*>(c.scratch));
  else return op_attn(c.p, w, *reinterpret_cast<AttnScratch*>(c.scratch));
}
template <int kNT, bool kTc> __device__ bool run_dispatch(ConsumerCtx& c, const Work& w) { return op_dispatch(c.p, w, *reinterpret_cast<DispatchScratch*>(c.scratch)); }
template <int kNT, bool kTc> __device__ bool run_sample(ConsumerCtx& c, const Work& w) { return op_sample(c.p, w, *reinterpret_cast<SampleScratch*>(c.scratch)); }
template <int kNT, bool kSwiGlu> __device__ bool run_gemm(ConsumerCtx& c, const Work& w) {
  return consume_gemm<kNT, kSwiGlu>(c.p, w, c.pages, c.n_slots, c.full, c.empty, reinterpret_cast<float*>(c.scratch), c.page_seq);
}
template <int kNT, bool kTc> __device__ bool run_qkv(ConsumerCtx& c, const Work& w) { return run_gemm<kNT, false>(c, w); }
template <int kNT, bool kTc> __device__ bool run_o_proj(ConsumerCtx& c, const Work& w) { return run_gemm<kNT, false>(c, w); }
template <int kNT, bool kTc> __device__ bool run_router(ConsumerCtx& c, const Work& w) { return run_gemm<kNT, false>(c, w); }
template <int kNT, bool kTc> __device__ bool run_lm_head(ConsumerCtx& c, const Work& w) { return run_gemm<kNT, false>(c, w); }
template <int kNT, bool kTc> __device__ bool run_expert_up(ConsumerCtx& c, const Work& w) { return run_gemm<kNT, true>(c, w); }
template <int kNT, bool kTc> __device__ bool run_expert_down(ConsumerCtx& c, const Work& w) { return run_gemm<kNT, false>(c, w); }

// Trace hook (trace.h): one record per Work, written by consumer thread 0 after the arrivals.
__device__ inline void trace_work(const MkParams& p, const Work& w, int64_t g0, int64_t c0) {
  TraceRecord r{};
  r.g_begin = g0;
  r.c_begin = c0;
  r.c_end = trace_clock();
  r.g_end = trace_gtime();
  r.kind = kTraceWork;
  r.op = w.op;
  r.layer = w.layer;
  r.task = w.task;
  r.arg0 = w.arg[0];
  r.arg1 = w.arg[1];
  r.arg2 = w.arg[2];
  trace_put(p.trace, p.trace_counts, p.trace_capacity, 0, r);
}

template <int kNT, bool kTc>
__device__ void consumer_loop(ConsumerCtx& c, Work* works, uint64_t* wfull, uint64_t* wempty) {
  const int tid = threadIdx.x;
  for (uint32_t seq = 0;; ++seq) {
    const uint32_t slot = seq % kWorkSlots;
    const bool got = mbar_wait_bounded(c.p, &wfull[slot], (seq / kWorkSlots) & 1, 400 + static_cast<int>(slot));
    if (consumer_any(!got)) return;
    const Work w = works[slot];
    consumer_sync();  // everyone has its copy: the slot may be refilled
    // A tensor-core attention item releases its slot only when done: the producer claims the next
    // item then (Producer::drain_attention), so no SM hoards items while others idle.
    const bool release_late = kTc && w.op == static_cast<int32_t>(Op::kAttn);
    if (tid == 0 && !release_late) ptx::mbar_arrive(&wempty[slot]);
    if (w.op == kWorkEnd || w.op == kWorkAbort) return;
    const int64_t trace_c0 = c.p.trace && tid == 0 ? trace_clock() : 0;
    const int64_t trace_g0 = c.p.trace && tid == 0 ? trace_gtime() : 0;
    bool ok = true;
    if (w.op != kWorkArriveOnly) {
      switch (static_cast<Op>(w.op)) {
#define MK_OP_CASE(e, name, drain) \
  case Op::k##e: ok = run_##name<kNT, kTc>(c, w); break;
        MD_OPS(MK_OP_CASE)
#undef MK_OP_CASE
        default:
          ok = false;
          if (tid == 0) set_error(c.p, kMkBadShape, -1, w.op, 0, w.task, -1);
      }
    }
    if (!ok) return;  // ops fail uniformly (every thread returns the same)
    if (tid == 0 && release_late) ptx::mbar_arrive(&wempty[slot]);
    if (w.n_arrives > 0) {
      consumer_sync();  // every thread's stores of this work are done
      if (tid == 0)
        for (int i = 0; i < w.n_arrives && i < 2; ++i) mk_arrive(c.p, w.arrive_counter[i], w.arrive_amount[i]);
    }
    if (c.p.trace && tid == 0) trace_work(c.p, w, trace_g0, trace_c0);
  }
}

template <int kNT, bool kTc>
__global__ void __launch_bounds__(kThreads, 1) megakernel(const __grid_constant__ MkParams p, int n_slots) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  uint64_t* full = bars;
  uint64_t* empty = bars + kMaxPages;
  uint64_t* wfull = bars + 2 * kMaxPages;
  uint64_t* wempty = wfull + kWorkSlots;
  Work* works = reinterpret_cast<Work*>(smem + kWorkOffset);
  uint8_t* scratch = smem + kScratchOffset;
  uint8_t* pages = smem + MkSmem<kNT, kTc>::kPagesOffset;
  if (threadIdx.x == 0) {
    for (int i = 0; i < n_slots; ++i) {
      ptx::mbar_init(&full[i], 1);
      ptx::mbar_init(&empty[i], kConsumerWarps);
    }
    for (int i = 0; i < kWorkSlots; ++i) {
      ptx::mbar_init(&wfull[i], 1);
      ptx::mbar_init(&wempty[i], 1);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  const int sm = blockIdx.x;
  const int begin = p.list_begin[sm], end = p.list_end[sm];
  if ((threadIdx.x >> 5) == kProducerWarp) {
    if ((threadIdx.x & 31) == 0) {
      Producer<kNT> prod(p, pages, n_slots, full, empty, works, wfull, wempty);
      prod.run(begin, end);
    }
    __syncwarp();
  } else {
    ConsumerCtx c{p, pages, n_slots, full, empty, scratch, 0};
    consumer_loop<kNT, kTc>(c, works, wfull, wempty);
  }
}

}  // namespace megadecode::cuda::mk
