// Prefill norms, one CTA per token: the layer's input norm with its prologue (the embedding row at
// layer 0, else the previous layer's MoE combine: h + sum_k w_k * down_k in k order, the decode
// megakernel's order), the post-attention norm (add mode: h = x + the O-proj's fp32 output, the
// one addition the O-proj's residual epilogue made), and the final norm (same prologue, last
// token only). The MoE combine is
// fused here so the residual stream is written once per layer and no float atomics are needed.
// Rows move as 16-byte vectors; each element's arithmetic is as in the megakernel.
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/rms_norm.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kThreads = 256;
constexpr int kVecs = 4;  // 4-float chunks a thread: hidden <= 4 * 4 * 256

// Thread x's chunks are x, x + 256, ...: chunk c holds elements 4c .. 4c + 3 (hidden % 4 == 0), so
// every row moves in 16-byte loads (8-byte for bf16), a warp's 512 contiguous bytes at a time.
__device__ __forceinline__ void fma4(float4& v, float w, const float4 d) {
  v.x += w * d.x;
  v.y += w * d.y;
  v.z += w * d.z;
  v.w += w * d.w;
}
__device__ __forceinline__ float4 bf16x4_to_float4(uint2 b) {
  return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u), __uint_as_float(b.y << 16),
                     __uint_as_float(b.y & 0xffff0000u));
}

__global__ void __launch_bounds__(kThreads) residual_norm_kernel(const ResidualNormArgs a) {
  __shared__ float scratch[32];
  const int t = a.token_begin + blockIdx.x;
  const int H = a.hidden, n4 = H / 4;
  float4 v[kVecs];
  const auto chunk = [](int j) { return static_cast<int>(threadIdx.x) + j * kThreads; };
  if (a.embed != nullptr) {
    const int32_t tok = a.tokens[t];
    if (tok < 0 || tok >= a.vocab) {  // uniform: every thread reads the same id
      if (threadIdx.x == 0) atomicCAS(a.error, 0, 1 + t);
      return;
    }
    const uint2* e = reinterpret_cast<const uint2*>(a.embed + static_cast<int64_t>(tok) * H);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) v[j] = chunk(j) < n4 ? bf16x4_to_float4(e[chunk(j)]) : make_float4(0, 0, 0, 0);
  } else if (a.add != nullptr) {
    const float4* h = reinterpret_cast<const float4*>(a.h + static_cast<int64_t>(t) * H);
    const float4* d = reinterpret_cast<const float4*>(a.add + static_cast<int64_t>(t) * H);
    float4 dv[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      v[j] = chunk(j) < n4 ? h[chunk(j)] : make_float4(0, 0, 0, 0);
      dv[j] = chunk(j) < n4 ? d[chunk(j)] : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j)
      v[j] = make_float4(v[j].x + dv[j].x, v[j].y + dv[j].y, v[j].z + dv[j].z, v[j].w + dv[j].w);
  } else {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) v[j] = make_float4(0, 0, 0, 0);
#pragma unroll 8  // the k expert rows' loads in flight together (the sum keeps k order)
    for (int k = 0; k < a.top_k; ++k) {
      const float wk = a.topk_w[t * a.top_k + k];
      const float4* d = reinterpret_cast<const float4*>(a.down + static_cast<int64_t>(a.token_slot[t * a.top_k + k]) * H);
#pragma unroll
      for (int j = 0; j < kVecs; ++j)
        if (chunk(j) < n4) fma4(v[j], wk, __ldcs(d + chunk(j)));  // read once: streamed past the L2
    }
    const float4* h = reinterpret_cast<const float4*>(a.h + static_cast<int64_t>(t) * H);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (chunk(j) >= n4) continue;
      const float4 hv = h[chunk(j)];
      v[j] = make_float4(hv.x + v[j].x, hv.y + v[j].y, hv.z + v[j].z, hv.w + v[j].w);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (chunk(j) >= n4) continue;
    if (a.x != nullptr) reinterpret_cast<float4*>(a.x + static_cast<int64_t>(t) * H)[chunk(j)] = v[j];
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(H) + a.eps);
  uint2* out = reinterpret_cast<uint2*>(a.out + static_cast<int64_t>(t - a.token_begin) * H);
  const uint2* nw = reinterpret_cast<const uint2*>(a.norm_w);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (chunk(j) >= n4) continue;
    const float4 w = bf16x4_to_float4(nw[chunk(j)]);
    const auto o = [&](float x, float wx) { return float_to_bf16_bits(round_bf16(x * r) * wx); };
    out[chunk(j)] = make_uint2(o(v[j].x, w.x) | static_cast<uint32_t>(o(v[j].y, w.y)) << 16,
                               o(v[j].z, w.z) | static_cast<uint32_t>(o(v[j].w, w.w)) << 16);
  }
}

}  // namespace

void residual_norm(const ResidualNormArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.hidden > 0 && a.hidden <= 4 * kVecs * kThreads && a.hidden % 4 == 0, "prefill norm: hidden ", a.hidden,
             " must be a multiple of 4 in 4..", 4 * kVecs * kThreads);
  MD_REQUIRE(a.norm_w != nullptr && a.out != nullptr, "prefill norm: null weight or output");
  MD_REQUIRE(a.token_begin >= 0 && a.token_begin <= a.n_tokens, "prefill norm: token range [", a.token_begin, ", ",
             a.n_tokens, ")");
  if (a.embed != nullptr) {
    MD_REQUIRE(a.tokens != nullptr && a.vocab > 0 && a.error != nullptr, "prefill norm: embedding mode needs tokens");
  } else if (a.add != nullptr) {
    MD_REQUIRE(a.h != nullptr && a.x != nullptr, "prefill norm: add mode needs h and x (the sum's destination)");
  } else {
    MD_REQUIRE(a.h != nullptr && a.down != nullptr && a.token_slot != nullptr && a.topk_w != nullptr && a.top_k >= 1,
               "prefill norm: MoE mode needs h, down, token_slot, topk_w and top_k >= 1");
  }
  const int n = a.n_tokens - a.token_begin;
  if (n == 0) return;
  residual_norm_kernel<<<n, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda::prefill
