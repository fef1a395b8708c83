// The megakernel's GEMM jobs (jobs.h): Y[tokens, rows] = act[tokens, k] * W[rows, k]^T for up to 64
// token positions, W streamed page by page through the ring by the loader, the activations resident
// in shared memory (bf16 rows, filled by the consumers per window). Weights are the mma.sync
// m16n8k16 A operand (packed fragment tiles, cuda/common/weight_pack.cuh), token positions the N
// operand in groups of 8 (B fragments read through the job's row map: position -> activation row).
// Code size: one noinline copy of the loop, the fill and the epilogue per token-group count
// (kNT); every op describes its fill and epilogue as data (the instruction cache holds the layer).
// Determinism and batch invariance: k block kb (counted from the job's first) is accumulated by
// consumer warp kb % 8 in increasing kb, and the 8 warp partials are summed in warp order: the sum
// order of an output depends on neither the batch, the tile, the page nor the window.
#pragma once

#include <cstdint>

#include "cuda/common/packed_mma.cuh"
#include "cuda/common/moe.cuh"  // silu
#include "cuda/megakernel/activation.cuh"
#include "cuda/megakernel/smem.cuh"

namespace megadecode::cuda::mk {

// A job as the loader and the consumers both see it.
struct GemmJob {
  const uint16_t* w;   // packed matrix
  int32_t n_kb_total;  // k blocks per row block of the matrix (row-block stride)
  int32_t n_kb;        // k blocks of the job (from k block 0)
  int32_t rb_begin, rb_end;
  JobLayout lay;       // pages and activation windows (jobs.h job_layout)
};

template <int kNT>
__device__ __forceinline__ GemmJob make_job(const uint16_t* w, int32_t n_kb_total, int32_t rb_begin, int32_t rb_end,
                                            int32_t rows, bool full_k_window) {
  GemmJob j;
  j.w = w;
  j.n_kb_total = n_kb_total;
  j.n_kb = n_kb_total;
  j.rb_begin = rb_begin;
  j.rb_end = rb_end;
  // full_k_window: the caller filled (or fills) the whole K at once (the expert jobs).
  j.lay = job_layout(rb_end - rb_begin, j.n_kb, Smem<kNT>::kPageRbMax, full_k_window ? 1 : rows,
                     full_k_window ? 1ll << 40 : Smem<kNT>::kActBytes);
  return j;
}

// The activation rows of a job and how its token positions map onto them.
struct ActRows {
  const uint16_t* base;  // row 0 of the window
  int32_t pitch;         // elements between rows
  const int16_t* rowmap;  // [n_tok] position -> row
  int32_t n_tok;
};

// Where a job's outputs go: one epilogue routine for every op (the kernel's code stays small
// enough for the instruction cache: one copy of the GEMM loop per token-group count).
enum class EpiKind : int32_t {
  kStore,     // y[tok * stride + row] = v                           (QKV)
  kRows,      // the same for row < n_rows only (padded rows)        (router, LM head)
  kResidual,  // y[tok * H + row] = residual(tok, row) + v           (O-proj: h = x + o)
  kSwiGlu,    // act[(slot0 + tok) * n_rows + col] = silu(gate) * up (expert up: row pairs i, i + 8)
  kCombine,   // comb[(token * K + k) * 16 + r] = v of slot slot0 + tok (expert down)
};
struct Epilogue {
  EpiKind kind;
  int32_t n_rows;          // kRows: rows of y; kSwiGlu: the intermediate size
  int64_t stride;          // kStore, kRows: elements per token row of y; kResidual: H
  float* y;
  const float* res;        // kResidual: the fp32 residual x, or nullptr: the embedding of tokens[tok]
  const uint16_t* embed;
  const int32_t* tokens;
  uint16_t* act;           // kSwiGlu
  int32_t slot0;           // kSwiGlu, kCombine: the expert's first slot
  int32_t K;               // kCombine: top-k
  const int16_t* slot_token;
  const int8_t* slot_k;
};

// The 8 warps' partials of one row block (red, warp order) summed and handed to the epilogue.
template <int kNT>
__device__ __forceinline__ void reduce_store(const float* red, int rb, int n_tok, const Epilogue& e) {
  using S = Smem<kNT>;
  auto sum_at = [&](int tok, int r) {
    float s = 0.0f;
#pragma unroll
    for (int ww = 0; ww < kConsumerWarps; ++ww) s += red[ww * (8 * kNT * S::kRedPitch) + tok * S::kRedPitch + r];
    return s;
  };
  if (e.kind == EpiKind::kSwiGlu) {
    for (int idx = threadIdx.x; idx < 8 * 8 * kNT; idx += kConsumerThreads) {
      const int i = idx & 7, tok = idx >> 3, col = rb * 8 + i;
      if (tok < n_tok && col < e.n_rows)
        e.act[static_cast<int64_t>(e.slot0 + tok) * e.n_rows + col] = float_to_bf16_bits(silu(sum_at(tok, i)) * sum_at(tok, i + 8));
    }
    return;
  }
  for (int idx = threadIdx.x; idx < 16 * 8 * kNT; idx += kConsumerThreads) {
    const int r = idx & 15, tok = idx >> 4, row = rb * 16 + r;
    if (tok >= n_tok) continue;
    const float v = sum_at(tok, r);
    switch (e.kind) {
      case EpiKind::kStore: e.y[tok * e.stride + row] = v; break;
      case EpiKind::kRows:
        if (row < e.n_rows) e.y[tok * e.stride + row] = v;
        break;
      case EpiKind::kResidual: {
        const int64_t at = tok * e.stride + row;
        const float res = e.res != nullptr ? __ldcg(e.res + at)
                                           : bf16_bits_to_float(e.embed[static_cast<int64_t>(e.tokens[tok]) * e.stride + row]);
        e.y[at] = res + v;
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

// Consumes the job's pages (the loader issues the same sequence) and, after the last k stage of
// each row block, reduces the warps' partials in warp order into the epilogue. `fill` loads
// activation window w (activation.cuh) before the first page of a window (the consumers meet
// before and after); `seq` is the CTA's page count. Task `t` (index `task`) names the trace
// records of its fills and page waits. All 256 consumer threads call it; false (uniformly) when
// the step failed.
template <int kNT>
__device__ __forceinline__ bool consume_job(const MkParams& p, const Task& t, int task, const Ring& ring, uint32_t& seq,
                                         const GemmJob& job, const ActRows& act, float* red, Fill& fill,
                                         const Epilogue& epi) {
  using S = Smem<kNT>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const PageGeo& geo = job.lay.geo;
  const int n_rb = job.rb_end - job.rb_begin;
  // Per token group, this lane's B-fragment row (positions past n_tok read row 0's: discarded).
  const uint16_t* xrow[kNT];
#pragma unroll
  for (int jt = 0; jt < kNT; ++jt) {
    const int pos = jt * 8 + g;
    xrow[jt] = act.base + static_cast<int64_t>(act.rowmap[pos < act.n_tok ? pos : 0]) * act.pitch + 2 * t4;
  }
  float acc[S::kPageRbMax][kNT][4];
#pragma unroll
  for (int m = 0; m < S::kPageRbMax; ++m)
#pragma unroll
    for (int jt = 0; jt < kNT; ++jt) acc[m][jt][0] = acc[m][jt][1] = acc[m][jt][2] = acc[m][jt][3] = 0.0f;
  int window = -1;
#pragma unroll 1
  for (int pg = 0; pg < geo.n_pages(); ++pg, ++seq) {
    const PageRef ref = page_ref(geo, n_rb, pg);
    const int w = ref.kb0 / job.lay.window_kb;
    TraceClock phase;
    if (w != window) {
      consumer_sync();  // the previous window's readers are done
      phase.start(p);
      fill_window(fill, w);
      consumer_sync();
      phase.stop(p, t, task, kPhaseFill);
      window = w;
    }
    const uint32_t slot = seq % ring.n_slots, parity = (seq / ring.n_slots) & 1;
    phase.start(p, p.trace != nullptr && !mbar_test_wait(&ring.full[slot], parity));
    const bool ok = mbar_wait_bounded(p, &ring.full[slot], parity, 100 + static_cast<int>(slot));
    phase.stop(p, t, task, kPhasePage);
    if (consumer_any(!ok)) return false;
    const uint8_t* page = ring.pages + static_cast<size_t>(slot) * kPageBytes;
    const int kb_w = w * job.lay.window_kb;  // first k block of the window
#pragma unroll 1
    for (int kk = (warp - ref.kb0 % 8 + 8) % 8; kk < geo.page_kb; kk += kConsumerWarps) {
      const int kb = ref.kb0 + kk;  // kb % 8 == warp
      uint32_t b0[kNT], b1[kNT];
#pragma unroll
      for (int jt = 0; jt < kNT; ++jt) {
        const uint16_t* x = xrow[jt] + (kb - kb_w) * 16;
        b0[jt] = *reinterpret_cast<const uint32_t*>(x);
        b1[jt] = *reinterpret_cast<const uint32_t*>(x + 8);
      }
#pragma unroll
      for (int m = 0; m < S::kPageRbMax; ++m) {
        if (m < ref.n_rb) {
          const uint4 f = *reinterpret_cast<const uint4*>(page + (m * geo.page_kb + kk) * kTileBytes + lane * 16);
          const uint32_t a[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
          for (int jt = 0; jt < kNT; ++jt) ptx::mma_bf16_16816(acc[m][jt], a, b0[jt], b1[jt]);
        }
      }
    }
    // Generic reads of the page are ordered before the loader's next bulk copy into it.
    ptx::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(&ring.empty[slot]);
    if (ref.kb0 + geo.page_kb < job.n_kb) continue;  // the row blocks' sums are not complete yet
    // The page's row blocks are complete: warp partials summed in warp order.
#pragma unroll
    for (int m = 0; m < S::kPageRbMax; ++m) {
      if (m >= ref.n_rb) continue;  // uniform
      consumer_sync();  // the previous round's readers are done with `red`
      float* mine = red + warp * (8 * kNT * S::kRedPitch);
#pragma unroll
      for (int jt = 0; jt < kNT; ++jt) {
        const int tok = jt * 8 + 2 * t4;
        mine[tok * S::kRedPitch + g] = acc[m][jt][0];
        mine[(tok + 1) * S::kRedPitch + g] = acc[m][jt][1];
        mine[tok * S::kRedPitch + g + 8] = acc[m][jt][2];
        mine[(tok + 1) * S::kRedPitch + g + 8] = acc[m][jt][3];
        acc[m][jt][0] = acc[m][jt][1] = acc[m][jt][2] = acc[m][jt][3] = 0.0f;
      }
      consumer_sync();
      reduce_store<kNT>(red, job.rb_begin + ref.rb0 + m, act.n_tok, epi);
    }
  }
  return true;
}

}  // namespace megadecode::cuda::mk
