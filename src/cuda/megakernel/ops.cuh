// The consumers' GEMM ops (one call per task, all 256 consumer threads; false = the step failed, in
// at least this thread: the caller makes it uniform), every one through one job loop (op_gemm) so the kernel holds one copy of the GEMM,
// fill and epilogue code (the instruction cache must hold a layer's code):
//   tiles (QKV, O-proj, router, LM head): one job; activation prologue, the pages, the epilogue;
//   EXPERT_UP: h's RMSNorm for every token (after the O-proj tiles, while the router runs; parallel
//     blocks: the layer input's, after the previous layer), the
//     layer's routing (after the router), then one job per expert segment of the share's up units;
//   EXPERT_DOWN: one job per (row block of the share, active expert), each row block combined in
//     top-k order with the residual (parallel blocks: x = (x + o) + F, o from the O-proj tiles);
//   DENSE_UP, DENSE_DOWN (parallel blocks' dense layers): one job, the share's units of the MLP's
//     interleaved gate/up rows (act[t, col], token-major) or its hidden row blocks (x = (x + o) + F).
// JobWalk numbers a task's jobs; the loader (loader.cuh) walks the same way, so both sides see one
// page sequence. Epilogue outputs other SMs read are plain stores, published by the task's arrival.
#pragma once

#include <cstdint>

#include "cuda/common/moe.cuh"
#include "cuda/megakernel/activation.cuh"
#include "cuda/megakernel/gemm.cuh"
#include "cuda/megakernel/sample.cuh"
#include "plan/moe_split.h"
#include "plan/tile_cut.h"

namespace megadecode::cuda::mk {

template <int kNT>
struct ConsumerCtx {
  const MkParams& p;
  Ring ring;
  RingPos rp;             // the next page to consume
  RouteSmem& route;
  uint64_t* route_bar;    // the loader's arrival per routing it computed (the tables' release)
  RedBuffers red;         // GEMM reduction scratch
  uint8_t* area;          // the union: attention scratch | sampler scratch | activation area
  Fill* fill;             // the current task's activation fill (shared memory)
  __device__ float* scale() const { return reinterpret_cast<float*>(area + Smem<kNT>::kScaleOffset); }
  __device__ float* combine() const { return reinterpret_cast<float*>(area + Smem<kNT>::kCombineOffset); }
  __device__ uint16_t* act() const { return reinterpret_cast<uint16_t*>(area + Smem<kNT>::kActOffset); }
};

// ---- job geometry, shared with the loader ----

// The packed matrix of a task whose job is one row-block range of one matrix: the static tiles
// (QKV, O_PROJ, ROUTER, LM_HEAD) and the dense FFN's shares (DENSE_UP, DENSE_DOWN).
__device__ __forceinline__ const uint16_t* tile_matrix(const MkParams& p, const Task& t) {
  switch (static_cast<Op>(t.op)) {
    case Op::kQkv: return p.w.layers[t.layer].qkv;
    case Op::kOProj: return p.w.layers[t.layer].o_proj;
    case Op::kRouter: return p.w.layers[t.layer].router;
    case Op::kDenseUp: return p.w.layers[t.layer].dense_up;
    case Op::kDenseDown: return p.w.layers[t.layer].dense_down;
    default: return p.w.lm_head;
  }
}

// moe_share (its 64-bit divisions) out of line: one copy for the consumers' and the loader's walks.
__device__ __noinline__ MoeShare share_of(int32_t n, const Task& t) {
  return moe_share(n, t.arg[0], t.arg[1], t.arg[2]);
}

constexpr int32_t kDownNoChunks = 1 << 30;  // a rows_cap no expert reaches

struct TaskJob {
  GemmJob job;
  int32_t ei;  // active expert index (expert jobs)
  DownJob down;  // EXPERT_DOWN: the hidden row block, the expert's slot chunk (plan/gemm_geometry.h)
};

// The jobs of a GEMM task, in the order both sides walk them (one division at the start, none per
// job):
//   tiles: one job, the task's row blocks [arg0, arg1);
//   EXPERT_UP: its share of the (active expert x up unit) list, one job per expert it touches;
//   EXPERT_DOWN: (row block of its share, active expert, chunk of the expert's tokens that fits
//   the activation area): plan/gemm_geometry.h down_walk_next;
//   DENSE_UP: one job, the units moe_share(dense_units, a0, a1, T) of the MLP's up matrix (a
//   unit = one row block: 8 gate + 8 up rows); DENSE_DOWN: one job, the hidden row blocks
//   moe_share(down_rbs, a0, a1, T) of its down matrix (the emulator's tile_dense_up/down).
// Expert jobs need the layer's routing in `r`.
struct JobWalk {
  int32_t kind;  // GemmKind
  int32_t at;    // up: the next unit of the flat list; down: the row block; one-range jobs: its first row block
  int32_t end;   // up: one past the share's last unit; down: one past its last row block; one-range: the range's end
  int32_t ei;    // up, down: the next active expert index
  int32_t tok;   // down: the next slot chunk's first token of the expert

  __device__ __forceinline__ void start(const MkParams& p, const Task& t, const RouteSmem& r) {
    const PlanShape& s = p.plan.shape;
    kind = gemm_kind(static_cast<Op>(t.op));
    at = t.arg[0];  // tiles: the task's row blocks (an empty range is no job: nothing to stream or store)
    end = t.arg[1];
    ei = 0;
    tok = 0;
    if (kind == kGemmUp) {
      const MoeShare u = share_of(r.n_active * s.up_units, t);
      at = u.begin;
      end = u.end;
      ei = u.begin / s.up_units;
    } else if (kind == kGemmDown) {
      const MoeShare rbs = share_of(s.down_rbs, t);
      at = rbs.begin;
      end = rbs.end;
    } else if (kind == kGemmDenseUp || kind == kGemmDenseDown) {
      const MoeShare sh = share_of(kind == kGemmDenseUp ? s.dense_units : s.down_rbs, t);
      at = sh.begin;
      end = sh.end;
    }
  }

  // kNT: the instantiation. At one token group an expert's tokens (<= 8) always fit the area
  // (check_megakernel_shape), so its walk takes no chunks and keeps the registers it had.
  template <int kNT>
  __device__ __forceinline__ bool next(const MkParams& p, const Task& t, const RouteSmem& r, TaskJob& out) {
    if (kind == kGemmDown) {
      if (!down_walk_next(at, ei, tok, end, r.n_active, kNT == 1 ? kDownNoChunks : p.geo[kGemmDown].rows_cap,
                          [&](int32_t i) { return static_cast<int32_t>(r.count[r.active[i]]); }, out.down))
        return false;
      const MkLayerWeights& lw = p.w.layers[t.layer];
      out.ei = out.down.ei;
      out.job = GemmJob{lw.experts_down + r.active[out.ei] * lw.expert_down_elems, out.down.rb, out.down.rb + 1};
      return true;
    }
    if (at >= end) return false;
    const PlanShape& s = p.plan.shape;
    out.ei = ei;
    if (kind == kGemmUp) {
      const int32_t e0 = ei * s.up_units, e1 = e0 + s.up_units;
      const int32_t b = end < e1 ? end : e1;
      const MkLayerWeights& lw = p.w.layers[t.layer];
      out.job = GemmJob{lw.experts_up + r.active[ei] * lw.expert_up_elems, at - e0, b - e0};
      at = b;
      ++ei;
    } else {  // tiles and dense shares: one job, the whole range
      out.job = GemmJob{tile_matrix(p, t), at, end};
      at = end;
    }
    return true;
  }
};

// ---- the ops ----

// Waits [first, last) of the task (thread 0), then everyone meets (the acquire is handed on).
template <int kNT>
__device__ __forceinline__ bool wait_task(ConsumerCtx<kNT>& c, const Task& t, int task, int first, int last) {
  return !consumer_any(!wait_counters(c.p, t, task, first, last));
}

// The layer's routing tables, from the loader (loader.cuh route_layer), at the layer's first routed
// task of this launch: every consumer thread waits for the loader's arrival (acquire).
template <int kNT>
__device__ __forceinline__ bool ensure_routing(ConsumerCtx<kNT>& c, const Task& t, int layer, int task) {
  if (c.route.taken_layer == layer) return true;  // uniform: written before a consumer barrier
  const uint32_t taken = c.route.taken;
  TraceClock phase;
  phase.start(c.p);
  const bool ok = mbar_wait_bounded(c.p, c.route_bar, taken & 1u, 400);
  phase.stop(c.p, t, task, kPhaseRouting);
  consumer_sync();  // every thread read taken_layer and taken
  if (threadIdx.x == 0) {
    c.route.taken_layer = layer;
    c.route.taken = taken + 1;
  }
  return ok;
}

// The activation fill and the epilogue of a GEMM task, as data. Thread 0 writes the fill (shared
// memory; read after the caller's next consumer barrier).
template <int kNT>
__device__ __forceinline__ void gemm_setup(ConsumerCtx<kNT>& c, const Task& t, const GemmGeo& g, Epilogue& epi) {
  const MkParams& p = c.p;
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const Op op = static_cast<Op>(t.op);
  const int L = t.layer;
  const int32_t* tokens = buf<int32_t>(p, b.token_ids);
  Fill f{};
  f.kind = FillKind::kNormed;
  f.window_kb = g.window_kb;
  f.n_kb = g.n_kb;
  f.pitch = g.pitch;
  f.filled = -1;
  f.dst = c.act();
  f.scale = c.scale();
  f.part = c.red.buf0;  // free whenever a fill runs (its callers meet first)
  f.ns.embed = p.w.embed;
  f.ns.tokens = tokens;
  f.ns.H = s.hidden;
  f.ns.eps = p.w.rms_eps;
  epi = Epilogue{};
  epi.kind = EpiKind::kStore;
  switch (op) {
    case Op::kQkv:
      f.ns.x = L == 0 ? nullptr : buf<float>(p, b.x);
      f.ns.weight = p.w.layers[L].input_norm;
      epi.y = buf<float>(p, b.qkv);
      epi.stride = static_cast<int64_t>(s.n_kv_heads) * s.qkv_group_rows;
      break;
    case Op::kOProj:
      f.kind = FillKind::kRows;
      f.src = buf<uint16_t>(p, b.attn_out);
      f.stride = s.n_heads * s.head_dim;
      epi.kind = EpiKind::kResidual;
      epi.y = buf<float>(p, b.h);
      epi.stride = s.hidden;
      epi.res = L == 0 ? nullptr : buf<float>(p, b.x);
      epi.embed = p.w.embed;
      epi.tokens = tokens;
      if (s.parallel) {  // o alone, beside the FFN: the down shares add (x + o) + F
        epi.kind = EpiKind::kStore;
        epi.y = buf<float>(p, b.o_out);
      }
      break;
    case Op::kRouter:
    case Op::kExpertUp:
      if (s.parallel) {  // the FFN reads the layer input as attention does (the embedding at layer 0)
        f.ns.x = L == 0 ? nullptr : buf<float>(p, b.x);
        f.ns.weight = p.w.layers[L].input_norm;
      } else {
        f.ns.x = buf<float>(p, b.h);
        f.ns.weight = p.w.layers[L].post_norm;
      }
      epi.kind = op == Op::kExpertUp ? EpiKind::kSwiGlu : EpiKind::kRows;
      epi.y = buf<float>(p, b.router_logits);
      epi.n_rows = op == Op::kExpertUp ? s.moe_inter : s.n_experts;
      epi.stride = s.n_experts;
      epi.act = buf<uint16_t>(p, b.act);
      break;
    case Op::kExpertDown:
      f.kind = FillKind::kRows;
      f.src = buf<uint16_t>(p, b.act);
      f.stride = s.moe_inter;
      epi.kind = EpiKind::kCombine;
      epi.y = c.combine();  // [token][k][16]: the row block's output of each (token, k)
      epi.K = s.top_k;
      epi.slot_token = c.route.slot_token;
      epi.slot_k = c.route.slot_k;
      break;
    case Op::kDenseUp:  // act[t, col] = silu(gate . xn) * (up . xn), token-major (bf16)
      f.ns.x = L == 0 ? nullptr : buf<float>(p, b.x);
      f.ns.weight = p.w.layers[L].input_norm;
      epi.kind = EpiKind::kSwiGlu;
      epi.n_rows = s.dense_inter;
      epi.act = buf<uint16_t>(p, b.act);
      break;
    case Op::kDenseDown:  // x[t, r] = (x[t, r] + o[t, r]) + down_r . act[t], in place (the layer's last writer)
      f.kind = FillKind::kRows;
      f.src = buf<uint16_t>(p, b.act);
      f.stride = s.dense_inter;
      epi.kind = EpiKind::kResidualFfn;
      epi.y = buf<float>(p, b.x);
      epi.res = buf<float>(p, b.o_out);
      epi.n_rows = L == 0 ? 1 : 0;
      epi.embed = p.w.embed;
      epi.tokens = tokens;
      epi.stride = s.hidden;
      break;
    default:  // LM head: logits = y * logit_scale, and the tile's LogitBest per token (lm_head_best)
      f.ns.x = buf<float>(p, b.x);
      f.ns.weight = p.w.final_norm;
      epi.kind = EpiKind::kLogits;
      epi.y = buf<float>(p, b.logits);
      epi.n_rows = s.vocab;
      epi.stride = s.vocab;
      epi.scale = s.logit_scale;
      epi.act = reinterpret_cast<uint16_t*>(c.combine());  // the LogitBest entries (lm_head_best_init)
      break;
  }
  if (threadIdx.x == 0) *c.fill = f;
}

// x = h + sum_k w_k down_k for the hidden rows of row block rb, every token (top-k order); the
// row block's (token, k) outputs are in `comb`. Parallel blocks: x = (x + o) + F with F the same
// sum from zero, o the layer's O-proj output (cpu-ref's order), x in place (the embedding's row at
// layer 0).
__device__ __forceinline__ void moe_combine(const MkParams& p, const RouteSmem& r, const float* comb, int rb, int layer) {
  const PlanShape& s = p.plan.shape;
  const int K = s.top_k, H = s.hidden;
  const BufferLayout& b = p.plan.buffers;
  // (h is 0 bytes in parallel plans, o_out in sequential ones: neither is read there.)
  const float* h = buf<float>(p, b.h);
  const float* o = buf<float>(p, b.o_out);
  float* x = buf<float>(p, b.x);
  for (int idx = threadIdx.x; idx < s.batch * 16; idx += kConsumerThreads) {
    const int tok = idx >> 4, row = rb * 16 + (idx & 15);
    float moe = 0.0f;
#pragma unroll 1
    for (int k = 0; k < K; ++k) moe += r.w[tok * K + k] * comb[(tok * K + k) * 16 + (idx & 15)];  // top-k order
    const int64_t at = static_cast<int64_t>(tok) * H + row;
    if (!s.parallel) {
      x[at] = __ldcg(h + at) + moe;
    } else {
      const int32_t* tokens = buf<int32_t>(p, b.token_ids);
      const float res =
          layer == 0 ? bf16_bits_to_float(p.w.embed[static_cast<int64_t>(tokens[tok]) * H + row]) : __ldcg(x + at);
      x[at] = (res + __ldcg(o + at)) + moe;
    }
  }
}

// An LM head tile's end: each token's LogitBest over its 16 positions (after the consumers meet:
// every epilogue of the tile is done) into lm_best[tile][token], the tile named by its first row
// block (plan/tile_cut.h). Published by the task's arrival, which the SAMPLE task waits for.
// Out of line, before and after op_gemm (nothing of them stays live through the job loop). The
// entries start empty: each is written by the thread that updates it (gemm.cuh reduce_store).
__device__ __noinline__ void lm_head_best_init(const MkParams& p, LogitBest* best) {
  for (int i = threadIdx.x; i < p.plan.shape.batch * 16; i += kConsumerThreads) best[i] = LogitBest{-INFINITY, 0x7fffffff};
}
__device__ __noinline__ void lm_head_best(const MkParams& p, int task, const LogitBest* best) {
  const PlanShape& s = p.plan.shape;
  consumer_sync();
  const int tile = tile_of_begin(0, (s.vocab + 15) / 16, s.n_lm_tasks, p.tasks[task].arg[0]);
  LogitBest* out = buf<LogitBest>(p, p.plan.buffers.lm_best) + static_cast<int64_t>(tile) * s.batch;
  for (int tok = threadIdx.x; tok < s.batch; tok += kConsumerThreads) {
    LogitBest b = best[tok * 16];
#pragma unroll 1
    for (int r = 1; r < 16; ++r) argmax_merge(b.value, b.id, best[tok * 16 + r].value, best[tok * 16 + r].id);
    out[tok] = b;
  }
}

// EXPERT_DOWN at one token group (batch <= 8) when a job is one page of the whole K: job i of the
// task (one row block of one active expert) is computed by consumer warp i % 8 alone, in the 8
// k-chains the 8 warps of consume_job would keep (k block kb in chain kb % 8, in increasing kb; the
// chains summed in chain order from zero: the same bits as consume_job's warp partials), and its
// outputs go straight to the combine store. No cross-warp reduction, no barrier a job: the warps
// consume up to a ring's worth of pages at once. Every warp waits for every page in order (so it
// sees each of a slot's phases and its parity waits stay unambiguous) and releases the ones it does
// not compute at once. The consumers meet before a fill (the area's readers are done) and before
// each row block's combine (every job's outputs are in comb), and after it before comb is written
// again.
__device__ __forceinline__ bool down_jobs_by_warp(ConsumerCtx<1>& c, const Task& t, int task, const GemmGeo& g,
                                                  JobWalk& walk, int late_wait) {
  const MkParams& p = c.p;
  const RouteSmem& r = c.route;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t4 = lane & 3;
  const int K = p.plan.shape.top_k;
  float* comb = c.combine();
  int s0 = 0, s1 = 0, job = 0;
  bool failed = false, comb_read = false;
  TaskJob tj;
  while (walk.next<1>(p, t, r, tj)) {  // uniform
    const int e = r.active[tj.ei];
    const int n_tok = r.count[e], j0 = r.offset[e], j1 = j0 + n_tok;
    if (j0 < s0 || j1 > s1) {
      consumer_sync();  // the area's readers (earlier jobs' warps) are done
      s0 = j0;
      s1 = down_group_end([&](int32_t i) { return r.offset[r.active[i]] + r.count[r.active[i]]; }, r.n_active, tj.ei + 1,
                          j0, j1, g.rows_cap);
      TraceClock phase;
      phase.start(p);
      fill_window(c.fill, 0, s0, s1 - s0);
      consumer_sync();
      phase.stop(p, t, task, kPhaseFill);
      comb_read = false;  // (the fill's barriers ordered the last combine's reads too)
    } else if (comb_read) {
      consumer_sync();  // the last row block's combine read comb
      comb_read = false;
    }
    TraceClock phase;
    phase.start(p, p.trace != nullptr && !mbar_test_wait(&c.ring.full[c.rp.slot], c.rp.phase));
    failed |= !mbar_wait_bounded(p, &c.ring.full[c.rp.slot], c.rp.phase, 100 + static_cast<int>(c.rp.slot));
    phase.stop(p, t, task, kPhasePage);
    if (job % kConsumerWarps == warp) {  // warp-uniform
      const uint8_t* page = c.ring.pages + static_cast<size_t>(c.rp.slot) * kPageBytes;
      const uint16_t* xrow = c.act() + static_cast<int64_t>(j0 - s0 + (gq < n_tok ? gq : 0)) * g.pitch + 2 * t4;
      // Chains 0-3, then 4-7 (each chain's k order is its own, so the halves change no bit; half the
      // accumulators live at a time), summed into v in chain order.
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
      for (int c0 = 0; c0 < kConsumerWarps; c0 += 4) {
        float acc[4][1][1][4];
#pragma unroll
        for (int ch = 0; ch < 4; ++ch) acc[ch][0][0][0] = acc[ch][0][0][1] = acc[ch][0][0][2] = acc[ch][0][0][3] = 0.0f;
#pragma unroll 1
        for (int kb0 = c0; kb0 < g.n_kb; kb0 += kConsumerWarps) {
#pragma unroll
          for (int ch = 0; ch < 4; ++ch) {
            const int kb = kb0 + ch;
            if (kb < g.n_kb) {
              const uint32_t b0[1] = {*reinterpret_cast<const uint32_t*>(xrow + kb * 16)};
              const uint32_t b1[1] = {*reinterpret_cast<const uint32_t*>(xrow + kb * 16 + 8)};
              packed_mma_k16<1, 1>(acc[ch], [&](int) { return page + kb * kTileBytes; }, b0, b1, 1);
            }
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int ch = 0; ch < 4; ++ch) v[q] += acc[ch][0][0][q];
      }
      // Element q of the C fragment: token 2 t4 + (q & 1), row gq + 8 (q >> 1) (store_partial's map).
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = 2 * t4 + (q & 1), row = gq + 8 * (q >> 1);
        if (tok < n_tok) {
          const int slot = j0 + tok;
          comb[(r.slot_token[slot] * K + r.slot_k[slot]) * 16 + row] = v[q];
        }
      }
      // Generic reads of the page are ordered before the loader's next bulk copy into it.
      ptx::fence_proxy_async_shared();
    }
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(&c.ring.empty[c.rp.slot]);
    c.rp.advance(c.ring.n_slots);
    ++job;
    if (walk.at != tj.job.rb_begin) {  // the row block's last job
      if (late_wait < t.n_waits) {  // the waits kept for the write (kLastWaitAtWrite; its barrier is the combine's too)
        if (!wait_task(c, t, task, late_wait, t.n_waits)) return false;
        late_wait = t.n_waits;
      }
      TraceClock comb_phase;
      comb_phase.start(p);
      consumer_sync();  // every job's outputs are in comb
      moe_combine(p, r, comb, tj.job.rb_begin, t.layer);
      comb_phase.stop(p, t, task, kPhaseCombine);
      comb_read = true;
    }
  }
  // A share with no combine still meets every wait before its arrival (down_done then implies the
  // layer's O-proj tiles, as the next layer's tasks assume).
  if (late_wait < t.n_waits && !wait_task(c, t, task, late_wait, t.n_waits)) return false;
  return !failed;
}

// Every GEMM task. The fill and the epilogue are set up per op as data; one job loop consumes.
template <int kNT>
__device__ __forceinline__ bool op_gemm(ConsumerCtx<kNT>& c, const Task& t, int task) {
  const MkParams& p = c.p;
  const PlanShape& s = p.plan.shape;
  const int B = s.batch;
  const GemmKind kind = gemm_kind(static_cast<Op>(t.op));
  const bool up = kind == kGemmUp, down = kind == kGemmDown;
  const GemmGeo& g = p.geo[kind];
  Epilogue epi;
  gemm_setup(c, t, g, epi);
  // h is complete after the O-proj tiles: the up task's norm runs while the router tiles do. Its
  // router wait is its last, and the loader's (it computes the routing after it): the consumers take
  // the routing instead. (Parallel blocks: its first wait is the previous layer's down shares, after
  // which x is final; at layer 0 it has only the router's wait, and the embedding fill comes before it.)
  // A down share with kLastWaitAtWrite meets its last wait (the O-proj tiles) at its first combine.
  const bool late = down && (t.flags & kLastWaitAtWrite) && !(p.flags & kMkDownWaitsFirst);
  const int first = up || late ? t.n_waits - 1 : t.n_waits;
  if (!wait_task(c, t, task, 0, first)) return false;  // (also publishes the fill)
  // The embedding rows: every token id must be in the vocabulary before a fill reads them. Parallel
  // blocks' router, expert-up and dense-up tasks read them at layer 0 too, waiting on no QKV tile.
  const bool embeds = kind == kGemmQkv || (s.parallel && (kind == kGemmRouter || up || kind == kGemmDenseUp));
  if (embeds && t.layer == 0) {
    const int32_t* tokens = buf<int32_t>(p, p.plan.buffers.token_ids);
    bool bad = false;
#pragma unroll 1
    for (int i = threadIdx.x; i < B; i += kConsumerThreads) bad |= tokens[i] < 0 || tokens[i] >= s.vocab;
    if (consumer_any(bad)) {
      if (threadIdx.x == 0) set_error(p, kMkBadInput, -1, tokens[0], s.vocab, task, -1);
      return false;
    }
  }
  if (up && g.window_kb == g.n_kb) {  // the whole K now, before the router's wait
    TraceClock phase;
    phase.start(p);
    fill_window(c.fill, 0, 0, B);
    consumer_sync();
    phase.stop(p, t, task, kPhaseFill);
  }
  // (An up share's router wait is the loader's: the routing's arrival implies it.)
  if (!up && !late && !wait_task(c, t, task, first, t.n_waits)) return false;
  int late_wait = late ? first : t.n_waits;  // the waits still to meet before a combine
  if ((up || down) && !ensure_routing(c, t, t.layer, task)) return false;
  const RouteSmem& r = c.route;
  int s0 = 0, s1 = 0;  // down: the slots [s0, s1) the activation area holds
  JobWalk walk;
  walk.start(p, t, r);
  if constexpr (kNT == 1) {
    if (down && g.page_kb == g.n_kb && g.window_kb == g.n_kb && (p.flags & kMkDownSplitK) == 0)
      return down_jobs_by_warp(c, t, task, g, walk, late_wait);
  }
  TaskJob tj;
  bool ok = true;  // this thread's page waits (made uniform at the task's end: megakernel.cuh)
  while (walk.next<kNT>(p, t, r, tj)) {  // uniform
    ActRows act{c.act(), g.pitch, nullptr, 0, B};
    if (up || down) {
      const int e = r.active[tj.ei];
      act.n_tok = r.count[e];
      epi.slot0 = r.offset[e];
      if (up) {
        act.rowmap = r.slot_token + epi.slot0;  // activation row = token
      } else {
        // The job's slot chunk, and with it (when the area does not hold it) the following whole
        // experts that fit: at most rows_cap rows at the whole K (plan/gemm_geometry.h).
        if constexpr (kNT > 1) {  // (at one token group the chunk is the whole expert: JobWalk::next)
          act.n_tok = tj.down.n_tok;
          epi.slot0 += tj.down.tok0;
        }
        const int j0 = epi.slot0, j1 = j0 + act.n_tok;
        if (j0 < s0 || j1 > s1) {
          s0 = j0;
          s1 = down_group_end([&](int32_t i) { return r.offset[r.active[i]] + r.count[r.active[i]]; }, r.n_active,
                              tj.ei + 1, j0, j1, g.rows_cap);
          TraceClock phase;
          phase.start(p);
          fill_window(c.fill, 0, s0, s1 - s0);  // the last job's readers met in its final barrier
          consumer_sync();
          phase.stop(p, t, task, kPhaseFill);
        }
        act.row_off = j0 - s0;
      }
    }
    ok &= consume_job<kNT>(p, t, task, c.ring, c.rp, g, tj.job, act, c.red, c.fill, B, epi);
    if (down && walk.at != tj.job.rb_begin) {  // the row block's last job: its every (token, k) is in comb
      if (late_wait < t.n_waits) {  // (its barrier is the combine's too)
        if (!wait_task(c, t, task, late_wait, t.n_waits)) return false;
        late_wait = t.n_waits;
      }
      TraceClock comb;
      comb.start(p);
      consumer_sync();
      moe_combine(p, r, c.combine(), tj.job.rb_begin, t.layer);
      comb.stop(p, t, task, kPhaseCombine);
    }
  }
  if (late_wait < t.n_waits && !wait_task(c, t, task, late_wait, t.n_waits)) return false;  // (as in down_jobs_by_warp)
  return ok;
}

}  // namespace megadecode::cuda::mk
