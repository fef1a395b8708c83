// The online-softmax state of attention and the log-sum-exp merge of partial states: the one
// home of this arithmetic, used by every attention kernel (the megakernel's tensor-core item,
// the prefill flash attention, the standalone decode kernel of the GPU tests) and, being
// host-and-device, by the CPU emulations that check them (tests/cuda/attention_tc_emu.h).
// Log2 domain: scores are already scaled by attn_scale * log2(e); a state is (m, l, o) with
// m = max score, l = sum 2^(s - m), o = sum 2^(s - m) v (unnormalised). An empty state is
// (-inf, 0, 0); nothing here makes a NaN from it.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace megadecode::cuda {

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
