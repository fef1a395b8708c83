// Prefill q/k per-head RMSNorm + RoPE + the paged KV write: one CTA per token, one warp per head
// of the fused QKV row (group-major, prefill_index.h qkv_col). The arithmetic is the decode
// megakernel's (cuda/common/qk_norm_rope.cuh, as the attention items use it): normed = (x * rsqrt(mean x^2 + eps)) * w in
// fp32 (lane + 32j element order, butterfly sum), RoPE (NeoX halves) from the host's table of cos and
// sin of float(pos) * inv_freq, then K = bf16(rope(k)), V = bf16(v). q is rounded to bf16
// here because the attention MMAs take bf16 (decode keeps q in fp32).
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/qk_norm_rope.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDim = 128;

__global__ void __launch_bounds__(kThreads) qk_rope_kernel(const QkRopeArgs a) {
  __shared__ float normed[kWarps][kMaxDim];
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int D = a.head_dim, gs = a.group_size, G = a.n_kv_heads, half = D / 2;
  const int pos = a.positions != nullptr ? a.positions[t] : a.start_pos + t;
  if (pos < 0) return;  // a padding row (uniform per CTA)
  const int32_t* table = a.positions != nullptr ? a.block_table + a.table_offsets[t] : a.block_table;
  const int64_t block = table[pos / a.block_size];
  const int slot = pos % a.block_size;
  const float* row = a.qkv + static_cast<int64_t>(t) * G * (gs + 2) * D;
  for (int job = warp; job < G * (gs + 2); job += kWarps) {
    const int g = job / (gs + 2), j = job % (gs + 2);
    const float* src = row + qkv_col(g, j, 0, gs, D);
    float v[kMaxDim / 32];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDim / 32; ++i) {
      const int d = lane + 32 * i;
      v[i] = d < D ? src[d] : 0.0f;
      ss += v[i] * v[i];
    }
    if (j == gs + 1) {  // V: stored as projected
      uint16_t* dst = a.v_cache + kv_offset(block, g, slot, 0, G, a.block_size, D);
#pragma unroll
      for (int i = 0; i < kMaxDim / 32; ++i)
        if (lane + 32 * i < D) dst[lane + 32 * i] = float_to_bf16_bits(v[i]);
      continue;
    }
    const float r = head_rms_scale(ss, D, a.eps);
    const uint16_t* nw = j < gs ? a.q_norm : a.k_norm;
#pragma unroll
    for (int i = 0; i < kMaxDim / 32; ++i) {
      const int d = lane + 32 * i;
      if (d < D) normed[warp][d] = (v[i] * r) * bf16_bits_to_float(nw[d]);
    }
    __syncwarp();
    uint16_t* dst = j < gs ? a.q + (static_cast<int64_t>(t) * G * gs + g * gs + j) * D
                           : a.k_cache + kv_offset(block, g, slot, 0, G, a.block_size, D);
#pragma unroll
    for (int i = 0; i < kMaxDim / 32; ++i) {
      const int d = lane + 32 * i;
      if (d >= D) continue;
      dst[d] = float_to_bf16_bits(rope_neox(normed[warp], d, half, a.rope[static_cast<int64_t>(pos) * half + d % half]));
    }
    __syncwarp();  // `normed` is rewritten by this warp's next job
  }
}

}  // namespace

void qk_norm_rope_store(const QkRopeArgs& a, cudaStream_t stream) {
  MD_REQUIRE(a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128, "prefill qk_norm_rope: head_dim ",
             a.head_dim, " not 32, 64 or 128");
  MD_REQUIRE(a.n_kv_heads > 0 && a.group_size > 0 && a.block_size > 0 && a.start_pos >= 0,
             "prefill qk_norm_rope: bad sizes");
  if (a.positions == nullptr)
    MD_REQUIRE(a.start_pos + a.n_tokens <= a.rope_positions, "prefill qk_norm_rope: positions up to ",
               a.start_pos + a.n_tokens, " past the model's RoPE table of ", a.rope_positions);
  else
    MD_REQUIRE(a.table_offsets != nullptr, "prefill qk_norm_rope: per-row positions need per-row table offsets");
  MD_REQUIRE(a.qkv && a.q_norm && a.k_norm && a.rope && a.block_table && a.q && a.k_cache && a.v_cache,
             "prefill qk_norm_rope: null pointer");
  if (a.n_tokens <= 0) return;
  qk_rope_kernel<<<a.n_tokens, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda::prefill
