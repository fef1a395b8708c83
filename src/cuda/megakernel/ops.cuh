// The consumers' GEMM ops (one call per task, all 256 consumer threads; false = the step failed,
// uniformly), every one through one job loop (op_gemm) so the kernel holds one copy of the GEMM,
// fill and epilogue code (the instruction cache must hold a layer's code):
//   tiles (QKV, O-proj, router, LM head): one job; activation prologue, the pages, the epilogue;
//   EXPERT_UP: h's RMSNorm for every token (after the O-proj tiles, while the router runs), the
//     layer's routing (after the router), then one job per expert segment of the share's up units;
//   EXPERT_DOWN: one job per (row block of the share, active expert), each row block combined in
//     top-k order with the residual.
// task_job() numbers a task's jobs; the loader (loader.cuh) walks the same numbering, so both sides
// see one page sequence. Epilogue outputs other SMs read are plain stores, published by the
// task's arrival.
#pragma once

#include <cstdint>

#include "cuda/common/moe.cuh"
#include "cuda/megakernel/activation.cuh"
#include "cuda/megakernel/gemm.cuh"
#include "cuda/megakernel/sample.cuh"
#include "plan/moe_split.h"

namespace megadecode::cuda::mk {

template <int kNT>
struct ConsumerCtx {
  const MkParams& p;
  Ring ring;
  uint32_t seq;           // pages consumed so far
  RouteSmem& route;
  uint64_t* route_bar;    // the loader waits on it for each routing
  float* red;             // GEMM reduction scratch
  uint8_t* area;          // the union: attention scratch | sampler scratch | activation area
  __device__ float* scale() const { return reinterpret_cast<float*>(area + Smem<kNT>::kScaleOffset); }
  __device__ int16_t* rowmap() const { return reinterpret_cast<int16_t*>(area + Smem<kNT>::kRowmapOffset); }
  __device__ float* combine() const { return reinterpret_cast<float*>(area + Smem<kNT>::kCombineOffset); }
  __device__ uint16_t* act() const { return reinterpret_cast<uint16_t*>(area + Smem<kNT>::kActOffset); }
};

// ---- job geometry, shared with the loader ----

// The packed matrix of a static tile task (QKV, O_PROJ, ROUTER, LM_HEAD) and its row-block stride.
__device__ inline const uint16_t* tile_matrix(const MkParams& p, const Task& t, int32_t* n_kb_total) {
  const PlanShape& s = p.plan.shape;
  const MkLayerWeights* lw = t.layer >= 0 ? &p.w.layers[t.layer] : nullptr;
  *n_kb_total = s.hidden / 16;
  switch (static_cast<Op>(t.op)) {
    case Op::kQkv: return lw->qkv;
    case Op::kOProj: *n_kb_total = s.n_heads * s.head_dim / 16; return lw->o_proj;
    case Op::kRouter: return lw->router;
    default: return p.w.lm_head;
  }
}

// The expert job of row blocks [rb0, rb1) of expert `expert`'s up (gate/up pairs, rows: every
// token's normed h) or down matrix (its activation rows filled for the whole K).
template <int kNT>
__device__ inline GemmJob expert_job(const MkParams& p, int layer, bool up, int expert, int32_t rb0, int32_t rb1) {
  const PlanShape& s = p.plan.shape;
  const MkLayerWeights& lw = p.w.layers[layer];
  return up ? make_job<kNT>(lw.experts_up + expert * lw.expert_up_elems, s.hidden / 16, rb0, rb1, s.batch, false)
            : make_job<kNT>(lw.experts_down + expert * lw.expert_down_elems, s.moe_inter / 16, rb0, rb1, 1, true);
}

// Job j of GEMM task t (false past its last), in the order both sides walk:
//   tiles: job 0, its row blocks [arg0, arg1);
//   EXPERT_UP: its share of the (active expert x up unit) list, one job per expert it touches;
//   EXPERT_DOWN: (row block rb of its share, active expert ei), ei fastest.
// Expert jobs need the layer's routing in `r`.
struct TaskJob {
  GemmJob job;
  int32_t ei;  // active expert index (expert jobs)
  int32_t rb;  // EXPERT_DOWN: the hidden row block
};
template <int kNT>
__device__ inline bool task_job(const MkParams& p, const Task& t, const RouteSmem& r, int j, TaskJob& out) {
  const PlanShape& s = p.plan.shape;
  const Op op = static_cast<Op>(t.op);
  if (op == Op::kExpertUp) {
    const MoeShare u = moe_share(r.n_active * s.up_units, t.arg[0], t.arg[1]);
    if (u.begin >= u.end) return false;
    const int ei = u.begin / s.up_units + j;
    const int32_t a = max(u.begin, ei * s.up_units), b = min(u.end, (ei + 1) * s.up_units);
    if (a >= b) return false;
    out.ei = ei;
    out.rb = 0;
    out.job = expert_job<kNT>(p, t.layer, true, r.active[ei], a - ei * s.up_units, b - ei * s.up_units);
    return true;
  }
  if (op == Op::kExpertDown) {
    const MoeShare rbs = moe_share(s.down_rbs, t.arg[0], t.arg[1]);
    const int rb = rbs.begin + j / r.n_active, ei = j % r.n_active;
    if (rb >= rbs.end) return false;
    out.ei = ei;
    out.rb = rb;
    out.job = expert_job<kNT>(p, t.layer, false, r.active[ei], rb, rb + 1);
    return true;
  }
  if (j > 0) return false;
  int32_t n_kb_total;
  const uint16_t* w = tile_matrix(p, t, &n_kb_total);
  out.ei = 0;
  out.rb = 0;
  out.job = make_job<kNT>(w, n_kb_total, t.arg[0], t.arg[1], s.batch, false);
  return true;
}

// ---- the ops ----

// Waits [first, last) of the task (thread 0), then everyone meets (the acquire is handed on).
template <int kNT>
__device__ inline bool wait_task(ConsumerCtx<kNT>& c, const Task& t, int task, int first, int last) {
  return !consumer_any(!wait_counters(c.p, t, task, first, last));
}

// The layer's routing into shared memory if it is not there yet (the first routed task of a layer
// in this launch), then the loader is told. Consumer side of loader.cuh's routing wait.
template <int kNT>
__device__ inline bool ensure_routing(ConsumerCtx<kNT>& c, const Task& t, int layer, int task) {
  if (c.route.layer == layer) return true;  // uniform: written before a consumer barrier
  TraceClock phase;
  phase.start(c.p);
  const bool ok = compute_routing(c.p, layer, c.route);
  phase.stop(c.p, t, task, kPhaseRouting);
  if (threadIdx.x == 0) ptx::mbar_arrive(c.route_bar);  // release: the tables to the loader
  if (!ok) {
    if (threadIdx.x == 0) set_error(c.p, kMkBadInput, -1, layer, c.p.plan.shape.n_experts, task, -2);
    return false;
  }
  return true;
}

// Every GEMM task. The fill and the epilogue are set up per op as data; one job loop consumes.
template <int kNT>
__device__ inline bool op_gemm(ConsumerCtx<kNT>& c, const Task& t, int task) {
  const MkParams& p = c.p;
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const Op op = static_cast<Op>(t.op);
  const int L = t.layer, B = s.batch, H = s.hidden, I = s.moe_inter, K = s.top_k;
  const bool up = op == Op::kExpertUp, down = op == Op::kExpertDown;
  const int32_t* tokens = buf<int32_t>(p, b.token_ids);
  // h is complete after the O-proj tiles: the up task's norm runs while the router tiles do.
  const int first = up && t.n_waits >= 2 ? 1 : t.n_waits;
  if (!wait_task(c, t, task, 0, first)) return false;
  if (op == Op::kQkv && L == 0) {  // the embedding rows: every token id must be in the vocabulary
    bool bad = false;
    for (int i = threadIdx.x; i < B; i += kConsumerThreads) bad |= tokens[i] < 0 || tokens[i] >= s.vocab;
    if (consumer_any(bad)) {
      if (threadIdx.x == 0) set_error(p, kMkBadInput, -1, tokens[0], s.vocab, task, -1);
      return false;
    }
  }
  Fill fill{};
  fill.kind = FillKind::kNormed;
  fill.n_rows = B;
  fill.filled = -1;
  fill.dst = c.act();
  fill.scale = c.scale();
  fill.part = c.red;  // free until a job's first reduction
  fill.ns.embed = p.w.embed;
  fill.ns.tokens = tokens;
  fill.ns.H = H;
  fill.ns.eps = p.w.rms_eps;
  Epilogue epi{};
  epi.kind = EpiKind::kStore;
  switch (op) {
    case Op::kQkv:
      fill.ns.x = L == 0 ? nullptr : buf<float>(p, b.x);
      fill.ns.weight = p.w.layers[L].input_norm;
      epi.y = buf<float>(p, b.qkv);
      epi.stride = static_cast<int64_t>(s.n_kv_heads) * s.qkv_group_rows;
      break;
    case Op::kOProj:
      fill.kind = FillKind::kRows;
      fill.src = buf<uint16_t>(p, b.attn_out);
      fill.stride = s.n_heads * s.head_dim;
      epi.kind = EpiKind::kResidual;
      epi.y = buf<float>(p, b.h);
      epi.stride = H;
      epi.res = L == 0 ? nullptr : buf<float>(p, b.x);
      epi.embed = p.w.embed;
      epi.tokens = tokens;
      break;
    case Op::kRouter:
    case Op::kExpertUp:
      fill.ns.x = buf<float>(p, b.h);
      fill.ns.weight = p.w.layers[L].post_norm;
      epi.kind = up ? EpiKind::kSwiGlu : EpiKind::kRows;
      epi.y = buf<float>(p, b.router_logits);
      epi.n_rows = up ? I : s.n_experts;
      epi.stride = s.n_experts;
      epi.act = buf<uint16_t>(p, b.act);
      break;
    case Op::kExpertDown:
      fill.kind = FillKind::kRows;
      fill.src = buf<uint16_t>(p, b.act);
      fill.stride = I;
      epi.kind = EpiKind::kCombine;
      epi.y = c.combine();  // [token][k][16]: the row block's output of each (token, k)
      epi.K = K;
      epi.slot_token = c.route.slot_token;
      epi.slot_k = c.route.slot_k;
      break;
    default:  // LM head
      fill.ns.x = buf<float>(p, b.x);
      fill.ns.weight = p.w.final_norm;
      epi.kind = EpiKind::kRows;
      epi.y = buf<float>(p, b.logits);
      epi.n_rows = s.vocab;
      epi.stride = s.vocab;
      break;
  }
  // The window geometry: the same for every job of the task (one matrix shape, one row count).
  {
    TaskJob shape;
    if (up || down) {
      shape.job = expert_job<kNT>(p, L, up, 0, 0, 1);
    } else {
      (void)task_job<kNT>(p, t, c.route, 0, shape);
    }
    fill.window_kb = shape.job.lay.window_kb;
    fill.n_kb = shape.job.n_kb;
    fill.pitch = shape.job.lay.window_kb * 16 + kActPad;
    if (up && shape.job.lay.n_windows(shape.job.n_kb) == 1) {  // the whole K now, before the router's wait
      TraceClock phase;
      phase.start(p);
      fill_window(fill, 0);
      consumer_sync();
      phase.stop(p, t, task, kPhaseFill);
    }
  }
  if (!wait_task(c, t, task, first, t.n_waits)) return false;
  if ((up || down) && !ensure_routing(c, t, L, task)) return false;
  const RouteSmem& r = c.route;
  const int cap_rows = Smem<kNT>::kActBytes / (fill.pitch * 2);  // down: slots the area holds
  int16_t* rowmap = c.rowmap();
  int group_end = 0, s0 = 0;  // down: the experts [.., group_end) whose slots (from s0) are filled
  for (int j = 0;; ++j) {
    TaskJob tj;
    if (!task_job<kNT>(p, t, r, j, tj)) break;  // uniform
    const int e = up || down ? r.active[tj.ei] : 0;
    int n_tok = B;
    consumer_sync();  // the previous job's row map and activations are no longer read
    if (up || down) {
      n_tok = r.count[e];
      epi.slot0 = r.offset[e];
      if (down && (tj.ei == 0 || tj.ei >= group_end)) {
        // Experts [ei, group_end) whose slots (contiguous) fit the activation area at the whole K.
        group_end = tj.ei + 1;
        s0 = epi.slot0;
        while (group_end < r.n_active && r.offset[r.active[group_end]] + r.count[r.active[group_end]] - s0 <= cap_rows)
          ++group_end;
        fill.row0 = s0;
        fill.n_rows = r.offset[r.active[group_end - 1]] + r.count[r.active[group_end - 1]] - s0;
        fill.filled = -1;
        fill_window(fill, 0);
        consumer_sync();
      }
      for (int i = threadIdx.x; i < n_tok; i += kConsumerThreads)
        rowmap[i] = up ? r.slot_token[epi.slot0 + i] : static_cast<int16_t>(epi.slot0 - s0 + i);
    } else if (j == 0) {
      for (int i = threadIdx.x; i < B; i += kConsumerThreads) rowmap[i] = static_cast<int16_t>(i);
    }
    consumer_sync();
    const ActRows act{c.act(), fill.pitch, rowmap, n_tok};
    if (!consume_job<kNT>(p, t, task, c.ring, c.seq, tj.job, act, c.red, fill, epi)) return false;
    if (down && tj.ei == r.n_active - 1) {  // the row block's every (token, k) is in `comb`
      consumer_sync();
      const float* h = buf<float>(p, b.h);
      float* x = buf<float>(p, b.x);
      for (int idx = threadIdx.x; idx < B * 16; idx += kConsumerThreads) {
        const int tok = idx / 16, rr = idx % 16, row = tj.rb * 16 + rr;
        float moe = 0.0f;
        for (int k = 0; k < K; ++k) moe += r.w[tok * K + k] * epi.y[(tok * K + k) * 16 + rr];  // top-k order
        const int64_t at = static_cast<int64_t>(tok) * H + row;
        x[at] = __ldcg(h + at) + moe;
      }
    }
  }
  return true;
}

}  // namespace megadecode::cuda::mk
