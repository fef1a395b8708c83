// The megakernel's GEMM jobs (plan/gemm_geometry.h): Y[tokens, rows] = act[tokens, k] * W[rows, k]^T for up to 64
// token positions, W streamed page by page through the ring by the loader, the activations resident
// in shared memory (bf16 rows, filled by the consumers per window). Weights are the mma.sync
// m16n8k16 A operand (packed fragment tiles, cuda/common/weight_pack.cuh; the k16 step is
// cuda/common/packed_mma.cuh's), token positions the N operand in groups of 8 (B fragments read
// from the activation row each position maps to).
// Code size: the kernel's per-layer code must stay in the instruction cache, so there is one copy of
// the page loop, the reduction and the epilogue per token-group count (kNT); every op describes its
// fill and epilogue as data, the page walk needs no division (plan/gemm_geometry.h, from the host), and a
// page needs no CTA barrier (each warp waits for it itself).
// Determinism and batch invariance: k block kb is accumulated by consumer warp kb % 8 in increasing
// kb, and the 8 warp partials are summed in warp order: the sum order of an output depends on
// neither the batch, the tile, the page nor the window.
#pragma once

#include <cstdint>

#include "cuda/common/moe.cuh"  // silu
#include "cuda/common/packed_mma.cuh"
#include "cuda/common/sampling.cuh"  // argmax_merge
#include "cuda/megakernel/activation.cuh"
#include "cuda/megakernel/smem.cuh"

namespace megadecode::cuda::mk {

// A job as the loader and the consumers both see it: row blocks [rb_begin, rb_end) of packed matrix
// w, whose geometry is the step's GemmGeo of its kind.
struct GemmJob {
  const uint16_t* w;
  int32_t rb_begin, rb_end;
};

// The activation rows of a job: token position pos < n_tok reads row
// rowmap ? rowmap[pos] : row_off + pos of the area (positions past n_tok read row 0's: discarded).
struct ActRows {
  const uint16_t* base;
  int32_t pitch;
  const int16_t* rowmap;  // nullptr: rows row_off + pos
  int32_t row_off;
  int32_t n_tok;
  __device__ __forceinline__ int row(int pos) const {
    const int q = pos < n_tok ? pos : 0;
    return rowmap != nullptr ? rowmap[q] : row_off + q;
  }
};

// Where a job's outputs go: one epilogue routine for every op.
enum class EpiKind : int32_t {
  kStore,     // y[tok * stride + row] = v                           (QKV)
  kRows,      // the same for row < n_rows only (padded rows)        (router)
  kLogits,    // kRows of v * scale, and lm_best_of(e)[tok * 16 + r] the running LogitBest of the
              // position (LM head: the sampler's first pass, sampling.cuh argmax_merge)
  kResidual,  // y[tok * H + row] = residual(tok, row) + v           (O-proj: h = x + o)
  kResidualFfn,  // y[at] = (residual(tok, row) + res[at]) + v      (dense down of a parallel block: x in place)
  kSwiGlu,    // act[(slot0 + tok) * n_rows + col] = silu(gate) * up (expert up: row pairs i, i + 8)
  kCombine,   // comb[(token * K + k) * 16 + r] = v of slot slot0 + tok (expert down)
};
struct Epilogue {
  EpiKind kind;
  int32_t n_rows;          // kRows: rows of y; kSwiGlu: the intermediate size; kResidualFfn: 1 when the
                           // residual is the embedding of tokens[tok] (layer 0), 0 when it is y itself
  int64_t stride;          // kStore, kRows: elements per token row of y; kResidual: H
  float* y;
  const float* res;        // kResidual: the fp32 residual x, or nullptr: the embedding of tokens[tok];
                           // kResidualFfn: the attention branch o [tokens][H] (other SMs' O-proj tiles wrote it)
  const uint16_t* embed;
  const int32_t* tokens;
  uint16_t* act;           // kSwiGlu; kLogits: the LogitBest[tokens * 16] (shared memory, each entry
                           // owned by one thread), riding here so that the epilogue, held in
                           // registers through the job loop, grows no field (lm_best_of)
  int32_t slot0;           // kSwiGlu, kCombine: the expert's first slot
  int32_t K;               // kCombine: top-k
  float scale;             // kLogits: the logit scale (1: v itself, bit for bit)
  const int16_t* slot_token;
  const int8_t* slot_k;
};

__device__ __forceinline__ LogitBest* lm_best_of(const Epilogue& e) { return reinterpret_cast<LogitBest*>(e.act); }

// The 8 warps' partials of one row block (red, warp order) summed and handed to the epilogue.
template <int kNT>
__device__ __forceinline__ void reduce_store(const float* red, int rb, int n_tok, const Epilogue& e) {
  using S = Smem<kNT>;
  const bool swiglu = e.kind == EpiKind::kSwiGlu;
  // kSwiGlu: 8 outputs (gate row i with up row i + 8) per token, else 16.
  const int per_tok = swiglu ? 8 : 16;
  for (int idx = threadIdx.x; idx < per_tok * n_tok; idx += kConsumerThreads) {
    const int r = swiglu ? (idx & 7) : (idx & 15), tok = swiglu ? (idx >> 3) : (idx >> 4);
    const float v = sum_partials<kConsumerWarps>(red, 8 * kNT * S::kRedPitch, tok * S::kRedPitch + r);
    const float u = swiglu ? sum_partials<kConsumerWarps>(red, 8 * kNT * S::kRedPitch, tok * S::kRedPitch + r + 8) : 0.0f;
    const int row = rb * 16 + r;
    switch (e.kind) {
      case EpiKind::kStore: e.y[tok * e.stride + row] = v; break;
      case EpiKind::kRows:
        if (row < e.n_rows) e.y[tok * e.stride + row] = v;
        break;
      case EpiKind::kLogits:
        if (row < e.n_rows) {
          const float l = v * e.scale;
          e.y[tok * e.stride + row] = l;
          LogitBest& b = lm_best_of(e)[idx];  // (idx = tok * 16 + r: this thread's in every call of the task)
          argmax_merge(b.value, b.id, l, row);
        }
        break;
      case EpiKind::kResidual: {
        const int64_t at = tok * e.stride + row;
        const float res = e.res != nullptr ? __ldcg(e.res + at)
                                           : bf16_bits_to_float(e.embed[static_cast<int64_t>(e.tokens[tok]) * e.stride + row]);
        e.y[at] = res + v;
        break;
      }
      case EpiKind::kResidualFfn: {  // cpu-ref's order: (x + o) + F, x in place (each element read, then written)
        // (o rides in `res` and the residual's source in n_rows: the epilogue, held in registers
        // through the job loop, grows no field for it.)
        const int64_t at = tok * e.stride + row;
        const float res = e.n_rows == 0 ? __ldcg(e.y + at)
                                        : bf16_bits_to_float(e.embed[static_cast<int64_t>(e.tokens[tok]) * e.stride + row]);
        e.y[at] = (res + __ldcg(e.res + at)) + v;
        break;
      }
      case EpiKind::kSwiGlu: {
        const int col = rb * 8 + r;
        if (col < e.n_rows) e.act[static_cast<int64_t>(e.slot0 + tok) * e.n_rows + col] = float_to_bf16_bits(silu(v) * u);
        break;
      }
      default: {  // kCombine
        const int slot = e.slot0 + tok;
        e.y[(e.slot_token[slot] * e.K + e.slot_k[slot]) * 16 + r] = v;
        break;
      }
    }
  }
}

// The consumers' place in the page ring.
struct RingPos {
  uint32_t slot = 0, phase = 0;
  __device__ __forceinline__ void advance(int n_slots) {
    if (++slot == static_cast<uint32_t>(n_slots)) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

// The consumers' reduction scratch: two buffers used in turn, so a row block's partials need one
// consumer barrier (the round before last, which used the same buffer, was read before the last
// round's barrier). With one buffer (buf0 == buf1: Smem::kTwoRedBuffers false) each round first
// waits for the last's readers (consume_job).
struct RedBuffers {
  float* buf0;
  float* buf1;
  bool second = false;  // the next round's buffer is buf1 (a select, not an index: no local memory)
  __device__ __forceinline__ float* take() {
    float* r = second ? buf1 : buf0;
    second = !second;
    return r;
  }
};

// Consumes the job's pages (the loader issues the same sequence, plan/gemm_geometry.h) and, after the last k
// stage of each row-block group, reduces the warps' partials in warp order into the epilogue.
// `fill` (shared memory) loads activation window w of rows [0, n_fill_rows) (activation.cuh) when
// the area does not hold it yet (the consumers meet before and after). Task `t` (index `task`)
// names the trace records of its fills.
// All 256 consumer threads call it; false in the threads whose page waits failed (the caller makes
// it uniform once per task, at its arrival barrier).
template <int kNT>
__device__ __forceinline__ bool consume_job(const MkParams& p, const Task& t, int task, const Ring& ring, RingPos& rp,
                                            const GemmGeo& g, const GemmJob& job, const ActRows& act, RedBuffers& red,
                                            Fill* fill, int n_fill_rows, const Epilogue& epi) {
  using S = Smem<kNT>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, t4 = lane & 3;
  const int n_rb = job.rb_end - job.rb_begin, page_kb = g.page_kb;
  // Per token group, this lane's B-fragment row.
  const uint16_t* xrow[kNT];
#pragma unroll
  for (int jt = 0; jt < kNT; ++jt) xrow[jt] = act.base + static_cast<int64_t>(act.row(jt * 8 + gq)) * act.pitch + 2 * t4;
  bool failed = false;
#pragma unroll 1
  for (int rb0 = 0; rb0 < n_rb; rb0 += g.page_rb) {
    const int nrb = min(g.page_rb, n_rb - rb0);
    float acc[S::kPageRbMax][kNT][4];
#pragma unroll
    for (int m = 0; m < S::kPageRbMax; ++m)
#pragma unroll
      for (int jt = 0; jt < kNT; ++jt) acc[m][jt][0] = acc[m][jt][1] = acc[m][jt][2] = acc[m][jt][3] = 0.0f;
    int win = 0, win_kb = 0;  // the window of the page and its first k block
#pragma unroll 1
    for (int kb0 = 0; kb0 < g.n_kb; kb0 += page_kb) {
      if (kb0 >= win_kb + g.window_kb) {
        ++win;
        win_kb += g.window_kb;
      }
      if (fill->filled != win) {  // uniform: written before a consumer barrier
        consumer_sync();          // the previous window's readers are done
        TraceClock phase;
        phase.start(p);
        fill_window(fill, win, 0, n_fill_rows);
        consumer_sync();
        phase.stop(p, t, task, kPhaseFill);
      }
      TraceClock phase;
      phase.start(p, p.trace != nullptr && !mbar_test_wait(&ring.full[rp.slot], rp.phase));
      failed |= !mbar_wait_bounded(p, &ring.full[rp.slot], rp.phase, 100 + static_cast<int>(rp.slot));
      phase.stop(p, t, task, kPhasePage);
      const uint8_t* page = ring.pages + static_cast<size_t>(rp.slot) * kPageBytes;
      const int kk0 = (warp - kb0) & 7;  // (kb0 + kk) % 8 == warp
      auto b_frags = [&](int kk, uint32_t (&b0)[kNT], uint32_t (&b1)[kNT]) {
        const int kx = (kb0 + kk - win_kb) * 16;
#pragma unroll
        for (int jt = 0; jt < kNT; ++jt) {
          b0[jt] = *reinterpret_cast<const uint32_t*>(xrow[jt] + kx);
          b1[jt] = *reinterpret_cast<const uint32_t*>(xrow[jt] + kx + 8);
        }
      };
      if (nrb == 1) {  // one row block (most pages): no branch in the loop, so its loads run ahead
#pragma unroll(kNT <= 2 ? 4 : 1)
        for (int kk = kk0; kk < page_kb; kk += kConsumerWarps) {
          uint32_t b0[kNT], b1[kNT];
          b_frags(kk, b0, b1);
          packed_mma_k16<S::kPageRbMax, kNT>(acc, [&](int) { return page + kk * kTileBytes; }, b0, b1, 1);
        }
      } else {
#pragma unroll 2
        for (int kk = kk0; kk < page_kb; kk += kConsumerWarps) {
          uint32_t b0[kNT], b1[kNT];
          b_frags(kk, b0, b1);
          packed_mma_k16<S::kPageRbMax, kNT>(acc, [&](int m) { return page + (m * page_kb + kk) * kTileBytes; }, b0,
                                             b1, nrb);
        }
      }
      // Generic reads of the page are ordered before the loader's next bulk copy into it.
      ptx::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&ring.empty[rp.slot]);
      rp.advance(ring.n_slots);
    }
    // The group's row blocks are complete: warp partials summed in warp order, one row block at a time.
#pragma unroll 1
    for (int m = 0; m < nrb; ++m) {
      if constexpr (!S::kTwoRedBuffers) consumer_sync();  // the last round's readers are done with it
      float* r = red.take();
#pragma unroll
      for (int mm = 0; mm < S::kPageRbMax; ++mm)
        if (mm == m) store_partial<kNT>(acc[mm], r + warp * (8 * kNT * S::kRedPitch), S::kRedPitch);  // constant index
      consumer_sync();
      reduce_store<kNT>(r, job.rb_begin + rb0 + m, act.n_tok, epi);
    }
  }
  return !failed;
}

}  // namespace megadecode::cuda::mk
