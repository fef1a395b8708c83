// The consumers' ops (one call per task, all 256 consumer threads; false = the step failed, uniformly):
//   GEMM tiles (QKV, O-proj, router, LM head): activation prologue, the job's pages, the epilogue;
//   EXPERT_UP: h's RMSNorm for every token (after the O-proj tiles, while the router runs), the
//     layer's routing (after the router), then the share's up units; EXPERT_DOWN: the share's hidden
//     row blocks over every active expert, combined in top-k order with the residual;
//   SAMPLE. The job geometry each op builds is the loader's too (loader.cuh walks the same tasks).
// Epilogue outputs other SMs read are plain stores, published by the task's arrival.
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

// The GEMM job of a static tile task (QKV, O_PROJ, ROUTER, LM_HEAD): its matrix and row blocks.
template <int kNT>
__device__ inline GemmJob tile_job(const MkParams& p, const Task& t) {
  const PlanShape& s = p.plan.shape;
  const MkLayerWeights* lw = t.layer >= 0 ? &p.w.layers[t.layer] : nullptr;
  const int kb_h = s.hidden / 16;
  switch (static_cast<Op>(t.op)) {
    case Op::kQkv: return make_job<kNT>(lw->qkv, kb_h, t.arg[0], t.arg[1], s.batch, false);
    case Op::kOProj: return make_job<kNT>(lw->o_proj, s.n_heads * s.head_dim / 16, t.arg[0], t.arg[1], s.batch, false);
    case Op::kRouter: return make_job<kNT>(lw->router, kb_h, t.arg[0], t.arg[1], s.batch, false);
    default: return make_job<kNT>(p.w.lm_head, kb_h, t.arg[0], t.arg[1], s.batch, false);
  }
}

// Up job of units [u0, u1) of active expert index ei (rows: h normed for every token).
template <int kNT>
__device__ inline GemmJob up_job(const MkParams& p, int layer, int expert, int u0, int u1) {
  const MkLayerWeights& lw = p.w.layers[layer];
  return make_job<kNT>(lw.experts_up + expert * lw.expert_up_elems, p.plan.shape.hidden / 16, u0, u1,
                       p.plan.shape.batch, false);
}

// Down job of expert `expert`, hidden row block rb (its activation rows are filled for the whole K).
template <int kNT>
__device__ inline GemmJob down_job(const MkParams& p, int layer, int expert, int rb) {
  const MkLayerWeights& lw = p.w.layers[layer];
  return make_job<kNT>(lw.experts_down + expert * lw.expert_down_elems, p.plan.shape.moe_inter / 16, rb, rb + 1, 1, true);
}

// Calls fn(expert, u0, u1) for each expert segment of this share's up units, in order.
template <class Fn>
__device__ inline void for_up_jobs(const PlanShape& s, const RouteSmem& r, const Task& t, Fn fn) {
  const MoeShare u = moe_share(r.n_active * s.up_units, t.arg[0], t.arg[1]);
  for (int32_t a = u.begin; a < u.end;) {
    const int ei = a / s.up_units;
    const int32_t seg_end = min(u.end, (ei + 1) * s.up_units);
    fn(static_cast<int>(r.active[ei]), a - ei * s.up_units, seg_end - ei * s.up_units);
    a = seg_end;
  }
}

// ---- the ops ----

// Thread 0 waits on waits [first, last) of the task; then everyone meets (the acquire is handed on).
template <int kNT>
__device__ inline bool wait_task(ConsumerCtx<kNT>& c, const Task& t, int task, int first, int last) {
  bool ok = true;
  if (threadIdx.x == 0)
    for (int i = first; ok && i < last; ++i) {
      int32_t seen = 0;
      const int64_t g0 = c.p.trace ? trace_gtime() : 0, c0 = c.p.trace ? trace_clock() : 0;
      ok = mk_wait_counter(c.p, t.wait[i].counter, t.wait[i].target, task, &seen);
      if (ok && c.p.trace && seen < t.wait[i].target) {
        TraceRecord r{};
        r.g_begin = g0;
        r.c_begin = c0;
        r.c_end = trace_clock();
        r.g_end = trace_gtime();
        r.kind = kTraceWait;
        r.op = t.op;
        r.layer = t.layer;
        r.task = task;
        r.arg0 = t.wait[i].counter;
        r.arg1 = t.wait[i].target;
        r.arg2 = seen;
        trace_put(c.p.trace, c.p.trace_counts, c.p.trace_capacity, 1, r);
      }
    }
  return !consumer_any(!ok);
}

// A GEMM tile: QKV (RMSNorm of x, or of the embedding at layer 0), O-proj (the attention output,
// h = x + o), router (RMSNorm of h), LM head (RMSNorm of the final x).
template <int kNT>
__device__ inline bool op_tile(ConsumerCtx<kNT>& c, const Task& t, int task) {
  const MkParams& p = c.p;
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const Op op = static_cast<Op>(t.op);
  const int L = t.layer, B = s.batch, H = s.hidden;
  if (!wait_task(c, t, task, 0, t.n_waits)) return false;
  const int32_t* tokens = buf<int32_t>(p, b.token_ids);
  if (op == Op::kQkv && L == 0) {  // the embedding rows: every token id must be in the vocabulary
    bool bad = false;
    for (int i = threadIdx.x; i < B; i += kConsumerThreads) bad |= tokens[i] < 0 || tokens[i] >= s.vocab;
    if (consumer_any(bad)) {
      if (threadIdx.x == 0) set_error(p, kMkBadInput, -1, tokens[0], s.vocab, task, -1);
      return false;
    }
  }
  const GemmJob job = tile_job<kNT>(p, t);
  const int pitch = job.lay.window_kb * 16 + kActPad;
  int16_t* rowmap = c.rowmap();
  for (int i = threadIdx.x; i < B; i += kConsumerThreads) rowmap[i] = static_cast<int16_t>(i);
  consumer_sync();
  NormSource ns{};
  ns.embed = p.w.embed;
  ns.tokens = tokens;
  ns.H = H;
  ns.eps = p.w.rms_eps;
  if (op == Op::kQkv) {
    ns.x = L == 0 ? nullptr : buf<float>(p, b.x);
    ns.weight = p.w.layers[L].input_norm;
  } else if (op == Op::kRouter) {
    ns.x = buf<float>(p, b.h);
    ns.weight = p.w.layers[L].post_norm;
  } else {
    ns.x = buf<float>(p, b.x);
    ns.weight = p.w.final_norm;
  }
  auto fill = [&](int w) {
    const int k0 = w * job.lay.window_kb * 16, kw = min(job.n_kb - w * job.lay.window_kb, job.lay.window_kb) * 16;
    if (op == Op::kOProj) {
      fill_rows(buf<uint16_t>(p, b.attn_out), s.n_heads * s.head_dim, 0, B, k0, kw, c.act(), pitch);
      return;
    }
    if (w == 0) {
      norm_scales(ns, B, c.scale());
      consumer_sync();
    }
    fill_normed(ns, c.scale(), B, k0, kw, c.act(), pitch);
  };
  const ActRows act{c.act(), pitch, rowmap, B};
  switch (op) {
    case Op::kQkv: {
      float* y = buf<float>(p, b.qkv);
      const int64_t stride = static_cast<int64_t>(s.n_kv_heads) * s.qkv_group_rows;
      return consume_job<kNT, false>(p, c.ring, c.seq, job, act, c.red, fill, [&](int rb, int tok, int r, float v) {
        y[tok * stride + rb * 16 + r] = v;
      });
    }
    case Op::kOProj: {
      float* h = buf<float>(p, b.h);
      const float* x = buf<float>(p, b.x);
      return consume_job<kNT, false>(p, c.ring, c.seq, job, act, c.red, fill, [&](int rb, int tok, int r, float v) {
        const int row = rb * 16 + r;
        const float res = L == 0 ? bf16_bits_to_float(p.w.embed[static_cast<int64_t>(tokens[tok]) * H + row])
                                 : __ldcg(x + static_cast<int64_t>(tok) * H + row);
        h[static_cast<int64_t>(tok) * H + row] = res + v;
      });
    }
    default: {
      const bool router = op == Op::kRouter;
      float* y = buf<float>(p, router ? b.router_logits : b.logits);
      const int n_rows = router ? s.n_experts : s.vocab;
      return consume_job<kNT, false>(p, c.ring, c.seq, job, act, c.red, fill, [&](int rb, int tok, int r, float v) {
        const int row = rb * 16 + r;
        if (row < n_rows) y[static_cast<int64_t>(tok) * n_rows + row] = v;
      });
    }
  }
}

// The layer's routing into shared memory if it is not there yet (the first routed task of a layer
// in this launch), then the loader is told. Consumer side of loader.cuh's routing wait.
template <int kNT>
__device__ inline bool ensure_routing(ConsumerCtx<kNT>& c, int layer, int task) {
  if (c.route.layer == layer) return true;  // uniform: written before a consumer barrier
  const bool ok = compute_routing(c.p, layer, c.route);
  if (threadIdx.x == 0) ptx::mbar_arrive(c.route_bar);  // release: the tables to the loader
  if (!ok) {
    if (threadIdx.x == 0) set_error(c.p, kMkBadInput, -1, layer, c.p.plan.shape.n_experts, task, -2);
    return false;
  }
  return true;
}

template <int kNT>
__device__ inline bool op_expert_up(ConsumerCtx<kNT>& c, const Task& t, int task) {
  const MkParams& p = c.p;
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const int L = t.layer, B = s.batch, H = s.hidden, I = s.moe_inter;
  // h is complete after the O-proj tiles: its norm runs while the router tiles do.
  const int first = t.n_waits >= 2 ? 1 : t.n_waits;
  if (!wait_task(c, t, task, 0, first)) return false;
  const NormSource ns{buf<float>(p, b.h), nullptr, nullptr, p.w.layers[L].post_norm, H, p.w.rms_eps};
  norm_scales(ns, B, c.scale());
  consumer_sync();
  const GemmJob shape = up_job<kNT>(p, L, 0, 0, 1);  // every up job has this window geometry
  const int pitch = shape.lay.window_kb * 16 + kActPad;
  int filled = -1;
  auto fill = [&](int w) {
    if (w == filled) return;
    const int k0 = w * shape.lay.window_kb * 16, kw = min(shape.n_kb - w * shape.lay.window_kb, shape.lay.window_kb) * 16;
    fill_normed(ns, c.scale(), B, k0, kw, c.act(), pitch);
    filled = w;
  };
  if (shape.lay.n_windows(shape.n_kb) == 1) {
    fill(0);
    consumer_sync();
  }
  if (!wait_task(c, t, task, first, t.n_waits)) return false;
  if (!ensure_routing(c, L, task)) return false;
  const RouteSmem& r = c.route;
  uint16_t* act_out = buf<uint16_t>(p, b.act);
  bool ok = true;
  for_up_jobs(s, r, t, [&](int e, int u0, int u1) {
    if (!ok) return;
    const int off = r.offset[e], n = r.count[e];
    int16_t* rowmap = c.rowmap();
    consumer_sync();  // the previous job's row map is no longer read
    for (int i = threadIdx.x; i < n; i += kConsumerThreads) rowmap[i] = r.slot_token[off + i];
    consumer_sync();
    const GemmJob job = up_job<kNT>(p, L, e, u0, u1);
    const ActRows act{c.act(), pitch, rowmap, n};
    ok = consume_job<kNT, true>(p, c.ring, c.seq, job, act, c.red, fill,
                                [&](int rb, int tok, int i, float gate, float up) {
                                  const int col = rb * 8 + i;
                                  if (col < I)
                                    act_out[static_cast<int64_t>(off + tok) * I + col] = float_to_bf16_bits(silu(gate) * up);
                                });
  });
  return ok;
}

template <int kNT>
__device__ inline bool op_expert_down(ConsumerCtx<kNT>& c, const Task& t, int task) {
  const MkParams& p = c.p;
  const PlanShape& s = p.plan.shape;
  const BufferLayout& b = p.plan.buffers;
  const int L = t.layer, B = s.batch, H = s.hidden, I = s.moe_inter, K = s.top_k;
  if (!wait_task(c, t, task, 0, t.n_waits)) return false;
  if (!ensure_routing(c, L, task)) return false;
  const RouteSmem& r = c.route;
  const int pitch = I + kActPad;
  const int cap_rows = Smem<kNT>::kActBytes / (pitch * 2);
  const uint16_t* act_in = buf<uint16_t>(p, b.act);
  const float* h = buf<float>(p, b.h);
  float* x = buf<float>(p, b.x);
  float* comb = c.combine();  // [token][k][16]: the row block's output of each (token, k)
  const MoeShare rbs = moe_share(s.down_rbs, t.arg[0], t.arg[1]);
  for (int rb = rbs.begin; rb < rbs.end; ++rb) {
    for (int ea = 0; ea < r.n_active;) {
      // Experts [ea, eb) whose slots (contiguous) fit the activation area at the whole K.
      int eb = ea + 1;
      const int s0 = r.offset[r.active[ea]];
      while (eb < r.n_active && r.offset[r.active[eb]] + r.count[r.active[eb]] - s0 <= cap_rows) ++eb;
      const int s1 = r.offset[r.active[eb - 1]] + r.count[r.active[eb - 1]];
      consumer_sync();  // the previous group's readers are done
      fill_rows(act_in, I, s0, s1 - s0, 0, I, c.act(), pitch);
      for (int ei = ea; ei < eb; ++ei) {
        const int e = r.active[ei], off = r.offset[e], n = r.count[e];
        int16_t* rowmap = c.rowmap();
        consumer_sync();  // the fill and the previous job's row map
        for (int i = threadIdx.x; i < n; i += kConsumerThreads) rowmap[i] = static_cast<int16_t>(off - s0 + i);
        consumer_sync();
        const GemmJob job = down_job<kNT>(p, L, e, rb);
        const ActRows act{c.act(), pitch, rowmap, n};
        if (!consume_job<kNT, false>(p, c.ring, c.seq, job, act, c.red, [](int) {},
                                     [&](int, int tok, int rr, float v) {
                                       const int slot = off + tok;
                                       comb[(r.slot_token[slot] * K + r.slot_k[slot]) * 16 + rr] = v;
                                     }))
          return false;
      }
      ea = eb;
    }
    consumer_sync();  // every (token, k) of the row block is in `comb`
    for (int idx = threadIdx.x; idx < B * 16; idx += kConsumerThreads) {
      const int tok = idx / 16, rr = idx % 16, row = rb * 16 + rr;
      float moe = 0.0f;
      for (int k = 0; k < K; ++k) moe += r.w[tok * K + k] * comb[(tok * K + k) * 16 + rr];  // top-k order
      const int64_t at = static_cast<int64_t>(tok) * H + row;
      x[at] = __ldcg(h + at) + moe;
    }
  }
  return true;
}

}  // namespace megadecode::cuda::mk
