// The online-softmax state of attention and the log-sum-exp merge of partial states: the one
// home of this arithmetic, used by every attention kernel (the megakernel's tensor-core item,
// the prefill flash attention) and, being host-and-device, by the CPU emulator of the plan
// (src/emu) and the lane-level emulation that checks the megakernel's item
// (tests/cuda/megakernel/attention_tc_emu.h).
// Log2 domain: scores are scaled by attn_scale_log2(attn_scale) = attn_scale * log2(e); a state is
// (m, l, o) with m = max score, l = sum 2^(s - m), o = sum 2^(s - m) v (unnormalised). An empty
// state is (-inf, 0, 0); nothing here makes a NaN from it.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace megadecode::cuda {

// The factor from q.k * attn_scale (natural-log softmax) to the log2 domain of the state.
MD_HOST_DEVICE inline float attn_scale_log2(float attn_scale) { return attn_scale * 1.4426950408889634f; }

// ---- online softmax: one step of a row's state over a tile of scores ----
// A row's state after a tile whose max is tile_max: returns the offset the tile's exponents use
// (0 while nothing was seen, avoiding (-inf) - (-inf)) and the factor the old l and o are scaled
// by; m becomes the new running max.
struct AttnRescale {
  float m_use, alpha;
};
MD_HOST_DEVICE inline AttnRescale attn_rescale(float& m, float tile_max) {
  const float m_new = fmaxf(m, tile_max);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const AttnRescale r{m_use, exp2f(m - m_use)};
  m = m_new;
  return r;
}

// A tile step works on the scores of one row that one thread holds, reached through an accessor
// score(i) -> float&, i in [0, n): a plain array on the host, accumulator elements on the device
// (AttnFragRow). With n a constant after inlining the loops unroll and the scores stay in
// registers. Where several threads share a row, the caller reduces the max and the sum between
// the steps (quad_max / quad_sum below); where one thread holds the row, AttnIdentity.

// Scales a row's raw scores q.k into the log2 domain (scale_log2 = attn_scale_log2(...)), -inf
// where keep(i) is false (keys past the causal or split end); returns their max.
template <class Score, class Keep>
MD_HOST_DEVICE inline float attn_scale_mask(int n, Score score, float scale_log2, Keep keep) {
  float mx = -INFINITY;
  MD_UNROLL
  for (int i = 0; i < n; ++i) {
    float& s = score(i);
    s = keep(i) ? s * scale_log2 : -INFINITY;
    mx = fmaxf(mx, s);
  }
  return mx;
}

// The exponentials of a tile whose max over the whole row is tile_max: m becomes the running max,
// each score is replaced by its weight p = round(2^(s - m_use)) (round: what the P operand of the
// next MMA keeps, so l sums the weights the output is made of; AttnIdentity for none). Returns
// alpha, the factor the old l and o are scaled by, and this thread's sum of the p in index order.
struct AttnTileExp {
  float alpha, sum;
};
// x unchanged: no rounding of the weights, no reduction of a sum.
struct AttnIdentity {
  MD_HOST_DEVICE float operator()(float x) const { return x; }
};
template <class Score, class Round>
MD_HOST_DEVICE inline AttnTileExp attn_exp_tile(float& m, float tile_max, int n, Score score, Round round) {
  const AttnRescale r = attn_rescale(m, tile_max);
  float sum = 0.0f;
  MD_UNROLL
  for (int i = 0; i < n; ++i) {
    float& s = score(i);
    s = round(exp2f(s - r.m_use));
    sum += s;
  }
  return {r.alpha, sum};
}

// The whole step of a row's (m, l): attn_exp_tile, then l = l * alpha + reduce(sum), where reduce
// sums the thread's share over the threads holding the row (identity when l is kept per thread
// and reduced once at the end). Returns alpha: o is the caller's to rescale (its layout and its
// fused multiply-add are the kernel's).
template <class Score, class Round, class Reduce>
MD_HOST_DEVICE inline float attn_online_step(float& m, float& l, float tile_max, int n, Score score, Round round,
                                             Reduce reduce) {
  const AttnTileExp t = attn_exp_tile(m, tile_max, n, score, round);
  l = l * t.alpha + reduce(t.sum);
  return t.alpha;
}

// Row h (0: the thread's row g, 1: row g + 8) of its m16n8k16 accumulators s[kN][4] as a score
// accessor: elements 0, 1 of each n8 tile belong to row g, 2, 3 to row g + 8, so score i is
// s[i / 2][2 h + i % 2], kScores of them, in key order within the thread.
template <int kN>
struct AttnFragRow {
  static constexpr int kScores = 2 * kN;
  float (&s)[kN][4];
  int h;
  MD_HOST_DEVICE float& operator()(int i) const { return s[i >> 1][2 * h + (i & 1)]; }
};

// ---- merge of partial states (warps of one item, splits of one sequence) ----
// Weight of a partial with max m_part in a merge whose max is m_all (0 for an empty partial).
MD_HOST_DEVICE inline float attn_merge_weight(float m_part, float m_all) {
  return m_part == -INFINITY ? 0.0f : exp2f(m_part - m_all);
}

// Log-sum-exp merge of n partials of one (row, d) element, in partial order. ld_m(i) -> the max of
// partial i, ld(i) -> its (m, l, o): loaders, so the device reads cross-SM partials with
// ld.global.cg. Returns the merged unnormalised o; m_out/l_out get the merged max and sum.
struct AttnPartial {
  float m, l, o;
};
template <class LoadM, class Load>
MD_HOST_DEVICE inline float attn_merge(int n, LoadM ld_m, Load ld, float& m_out, float& l_out) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, ld_m(i));
  float o = 0.0f, l = 0.0f;
  for (int i = 0; i < n; ++i) {
    const AttnPartial pi = ld(i);
    const float f = attn_merge_weight(pi.m, mx);
    o += f * pi.o;
    l += f * pi.l;
  }
  m_out = mx;
  l_out = l;
  return o;
}

// The normalised output of a merged row (0 for a row that saw no key, never a NaN).
MD_HOST_DEVICE inline float attn_normalise(float o, float l) { return l > 0.0f ? o / l : 0.0f; }

#if defined(__CUDACC__)
// ---- the m16n8k16 accumulator layout: a row's values are spread over the 4 lanes of a quad ----
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
#endif

}  // namespace megadecode::cuda
