// The megakernel's GEMM jobs (jobs.h): Y[tokens, rows] = act[tokens, k] * W[rows, k]^T for up to 64
// token positions, W streamed page by page through the ring by the loader, the activations resident
// in shared memory (bf16 rows, filled by the consumers per window). Weights are the mma.sync
// m16n8k16 A operand (packed fragment tiles, cuda/common/weight_pack.cuh), token positions the N
// operand in groups of 8 (B fragments read through the job's row map: position -> activation row).
// Determinism and batch invariance: k block kb (counted from the job's first) is accumulated by
// consumer warp kb % 8 in increasing kb, and the 8 warp partials are summed in warp order: the sum
// order of an output depends on neither the batch, the tile, the page nor the window.
#pragma once

#include <cstdint>

#include "cuda/common/packed_mma.cuh"
#include "cuda/megakernel/smem.cuh"

namespace megadecode::cuda::mk {

// A job as the loader and the consumers both see it.
struct GemmJob {
  const uint16_t* w;   // packed matrix
  int32_t n_kb_total;  // k blocks per row block of the matrix (row-block stride)
  int32_t n_kb;        // k blocks of the job (from k block 0)
  int32_t rb_begin, rb_end;
  int32_t rows;        // activation rows the job's windows hold (jobs.h job_layout)
  JobLayout lay;
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
  j.rows = rows;
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

// Consumes the job's pages (the loader issues the same sequence) and, after the last k stage of
// each row block, reduces the warps' partials in warp order and hands every output to
// epi(rb, tok, r, y) (kPaired: epi(rb, tok, i, y_i, y_{i+8}) for i < 8: the SwiGLU row pairs).
// fill(window) loads activation window w into the area `act.base` points at (called before the
// first page of a window; the consumers meet before and after). `seq` is the CTA's page count.
// All 256 consumer threads call it; returns false (uniformly) when the step failed.
template <int kNT, bool kPaired, class Fill, class Epi>
__device__ bool consume_job(const MkParams& p, const Ring& ring, uint32_t& seq, const GemmJob& job, const ActRows& act,
                            float* red, Fill fill, Epi epi) {
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
  bool ok = true;
  for (int pg = 0; pg < geo.n_pages(); ++pg, ++seq) {
    const PageRef ref = page_ref(geo, n_rb, pg);
    const int w = ref.kb0 / job.lay.window_kb;
    if (w != window) {
      consumer_sync();  // the previous window's readers are done
      fill(w);
      consumer_sync();
      window = w;
    }
    const uint32_t slot = seq % ring.n_slots, parity = (seq / ring.n_slots) & 1;
    ok = mbar_wait_bounded(p, &ring.full[slot], parity, 100 + static_cast<int>(slot));
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
      auto sum_at = [&](int tok, int r) {
        float s = 0.0f;
#pragma unroll
        for (int ww = 0; ww < kConsumerWarps; ++ww) s += red[ww * (8 * kNT * S::kRedPitch) + tok * S::kRedPitch + r];
        return s;
      };
      const int rb = job.rb_begin + ref.rb0 + m;
      if constexpr (kPaired) {
        for (int idx = tid; idx < 8 * 8 * kNT; idx += kConsumerThreads) {
          const int i = idx & 7, tok = idx >> 3;
          if (tok < act.n_tok) epi(rb, tok, i, sum_at(tok, i), sum_at(tok, i + 8));
        }
      } else {
        for (int idx = tid; idx < 16 * 8 * kNT; idx += kConsumerThreads) {
          const int r = idx & 15, tok = idx >> 4;
          if (tok < act.n_tok) epi(rb, tok, r, sum_at(tok, r));
        }
      }
    }
  }
  return true;
}

}  // namespace megadecode::cuda::mk
