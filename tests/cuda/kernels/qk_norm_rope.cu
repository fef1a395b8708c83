// Standalone kernel: per-head q/k norm + RoPE + KV append; one CTA per token, one warp per head.
#include "core/bf16.h"
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "kernels.h"

namespace megadecode::cuda {
namespace {

// Test-only semantics (the test's host reference): normed = bf16(bf16(x * rsqrt(mean(x^2) + eps))
// * w); RoPE in fp32 with inv_freq[i] = 1 / theta^(float(2i) / head_dim) (HF's fp32 formulas);
// the result rounded to bf16 once. The backends' arithmetic is cuda/common/qk_norm_rope.cuh's.
// One warp rotates/normalises head vector x (fp32, head_dim = 32 * kPer values; lane holds
// elements [lane*kPer, lane*kPer + kPer)) and returns the bf16-rounded results in `y`.
template <int kPer>
__device__ __forceinline__ void norm_rope_head(float (&v)[kPer], const uint16_t* __restrict__ norm_w, float eps,
                                               bool rope, int pos, float theta) {
  constexpr int kD = 32 * kPer;
  const int lane = threadIdx.x & 31;
  if (norm_w != nullptr) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) ss += v[e] * v[e];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / float(kD) + eps);
#pragma unroll
    for (int e = 0; e < kPer; ++e)
      v[e] = round_bf16(round_bf16(v[e] * r) * bf16_bits_to_float(norm_w[lane * kPer + e]));
  }
  if (rope) {
    // Element i pairs with i +- kD/2, which lives in lane +- 16 at the same e.
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const float partner = __shfl_xor_sync(0xffffffffu, v[e], 16);
      const int i = (lane * kPer + e) % (kD / 2);
      const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(kD));
      float s, c;
      sincosf(float(pos) * inv_freq, &s, &c);
      v[e] = lane < 16 ? v[e] * c - partner * s : v[e] * c + partner * s;
    }
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) v[e] = round_bf16(v[e]);
}

template <int kPer>
__global__ void qk_norm_rope_kernel(const QkNormRopeArgs a) {
  constexpr int kD = 32 * kPer;
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int pos = a.positions[t];
  const int n_jobs = a.n_heads + 2 * a.n_kv_heads;
  for (int head = threadIdx.x >> 5; head < n_jobs; head += blockDim.x >> 5) {
    float v[kPer];
    const float* src = a.qkv + int64_t(t) * a.qkv_stride + int64_t(head) * kD + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) v[e] = src[e];
    uint16_t* dst;
    if (head < a.n_heads) {
      norm_rope_head<kPer>(v, a.q_norm, a.eps, true, pos, a.rope_theta);
      dst = a.q_out + (int64_t(t) * a.n_heads + head) * kD;
    } else {
      const bool is_k = head < a.n_heads + a.n_kv_heads;
      const int kvh = head - a.n_heads - (is_k ? 0 : a.n_kv_heads);
      if (is_k) {
        norm_rope_head<kPer>(v, a.k_norm, a.eps, true, pos, a.rope_theta);
      } else {
#pragma unroll
        for (int e = 0; e < kPer; ++e) v[e] = round_bf16(v[e]);
      }
      const int64_t block = a.block_table[int64_t(t) * a.max_blocks + pos / a.block_size];
      dst = (is_k ? a.k_cache : a.v_cache) + ((block * a.n_kv_heads + kvh) * a.block_size + pos % a.block_size) * kD;
    }
#pragma unroll
    for (int e = 0; e < kPer; ++e) dst[lane * kPer + e] = float_to_bf16_bits(v[e]);
  }
}

}  // namespace

void qk_norm_rope(const QkNormRopeArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128, "qk_norm_rope: head_dim ", a.head_dim,
             " not 32, 64 or 128");
  MD_REQUIRE(a.n_heads > 0 && a.n_kv_heads > 0 && a.block_size > 0 && a.max_blocks > 0, "qk_norm_rope: bad sizes");
  MD_REQUIRE(a.qkv_stride >= (a.n_heads + 2 * a.n_kv_heads) * a.head_dim, "qk_norm_rope: qkv_stride too small");
  MD_REQUIRE((a.q_norm == nullptr) == (a.k_norm == nullptr), "qk_norm_rope: give both q_norm and k_norm or neither");
  if (a.n_tokens <= 0) return;
  switch (a.head_dim) {
    case 32: qk_norm_rope_kernel<1><<<a.n_tokens, 256, 0, stream>>>(a); break;
    case 64: qk_norm_rope_kernel<2><<<a.n_tokens, 256, 0, stream>>>(a); break;
    default: qk_norm_rope_kernel<4><<<a.n_tokens, 256, 0, stream>>>(a); break;
  }
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda
