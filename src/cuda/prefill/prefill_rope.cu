// Prefill q/k per-head RMSNorm + RoPE + the paged KV write (or, for cohere2_moe, no norms, NoPE or
// interleaved RoPE, and a sliding layer's ring): one CTA per token, one warp per head
// of the fused QKV row (group-major, prefill_index.h qkv_col). The arithmetic is the decode
// megakernel's (cuda/common/qk_norm_rope.cuh, as the attention items use it): normed = (x * rsqrt(mean x^2 + eps)) * w in
// fp32 (lane + 32j element order, butterfly sum), RoPE (NeoX halves) from the host's table of cos and
// sin of float(pos) * inv_freq, then K = bf16(rope(k)), V = bf16(v). q is rounded to bf16
// here because the attention MMAs take bf16 (decode keeps q in fp32).
//
// The CTA first issues every load it needs at once — its token's whole row as 16-byte pieces into
// shared memory, and each lane's norm weights and (cos, sin) pairs into registers — then the warps
// walk the heads from shared memory. A warp that loaded each head's elements from global memory on
// its own, head after head, waited a memory round trip per head (the 8192-token piece's kernel ran
// at a third of the HBM's rate).
#include "core/check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/qk_norm_rope.cuh"
#include "cuda/prefill/prefill_kernels.h"

namespace megadecode::cuda::prefill {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRowVecs = 12;  // 16-byte pieces of the row a thread: rows of up to 12 * 4 * 256 floats
constexpr int kMaxRowFloats = kMaxRowVecs * 4 * kThreads;

template <int D>
__global__ void __launch_bounds__(kThreads) qk_rope_kernel(const QkRopeArgs a) {
  extern __shared__ float4 row_vecs[];  // the token's fused QKV row
  constexpr int kN = D / 32, kHalf = D / 2;
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gs = a.group_size, G = a.n_kv_heads, cols = G * (gs + 2) * D, n4 = cols / 4;
  const int pos = a.positions != nullptr ? a.positions[t] : a.start_pos + t;
  if (pos < 0) return;  // a padding row (uniform per CTA)
  const float4* src = reinterpret_cast<const float4*>(a.qkv + static_cast<int64_t>(t) * cols);
  float4 v4[kMaxRowVecs];
#pragma unroll
  for (int j = 0; j < kMaxRowVecs; ++j)
    if (threadIdx.x + j * kThreads < n4) v4[j] = src[threadIdx.x + j * kThreads];
  // Lane-owned constants: elements d = lane + 32 i of every head.
  const bool normed = a.q_norm != nullptr;
  float qw[kN], kw[kN];
  float2 cs[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int d = lane + 32 * i;
    qw[i] = normed ? bf16_bits_to_float(a.q_norm[d]) : 1.0f;
    kw[i] = normed ? bf16_bits_to_float(a.k_norm[d]) : 1.0f;
    cs[i] = a.use_rope ? a.rope[static_cast<int64_t>(pos) * kHalf + (a.rope_interleaved ? d >> 1 : d % kHalf)]
                       : float2{1.0f, 0.0f};
  }
  const int32_t* table = a.positions != nullptr ? a.block_table + a.table_offsets[t] : a.block_table;
  const int cpos = pos - a.cache_pos_offset;
  const int64_t block = table[a.ring_len > 0 ? (cpos / a.block_size) % a.ring_len : cpos / a.block_size];
  const int slot = cpos % a.block_size;
#pragma unroll
  for (int j = 0; j < kMaxRowVecs; ++j)
    if (threadIdx.x + j * kThreads < n4) row_vecs[threadIdx.x + j * kThreads] = v4[j];
  __syncthreads();
  const float* row = reinterpret_cast<const float*>(row_vecs);
  for (int job = warp; job < G * (gs + 2); job += kWarps) {
    const int g = job / (gs + 2), j = job % (gs + 2);
    const float* x = row + qkv_col(g, j, 0, gs, D);
    float v[kN];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      v[i] = x[lane + 32 * i];
      ss += v[i] * v[i];
    }
    if (j == gs + 1) {  // V: stored as projected
      uint16_t* dst = a.v_cache + kv_offset(block, g, slot, 0, G, a.block_size, D);
#pragma unroll
      for (int i = 0; i < kN; ++i) dst[lane + 32 * i] = float_to_bf16_bits(v[i]);
      continue;
    }
    float nv[kN];
    if (normed) {
      const float r = head_rms_scale(ss, D, a.eps);
#pragma unroll
      for (int i = 0; i < kN; ++i) nv[i] = (v[i] * r) * (j < gs ? qw[i] : kw[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) nv[i] = v[i];
    }
    uint16_t* dst = j < gs ? a.q + (static_cast<int64_t>(t) * G * gs + g * gs + j) * D
                           : a.k_cache + kv_offset(block, g, slot, 0, G, a.block_size, D);
    if (!a.use_rope) {  // a NoPE layer (uniform per launch)
#pragma unroll
      for (int i = 0; i < kN; ++i) dst[lane + 32 * i] = float_to_bf16_bits(nv[i]);
      continue;
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int d = lane + 32 * i;
      float partner;
      if (a.rope_interleaved) {  // element d's partner d ^ 1: the neighbouring lane's element i
        partner = __shfl_xor_sync(0xffffffffu, nv[i], 1);
        dst[d] = float_to_bf16_bits(rope_neox_pair(nv[i], partner, (d & 1) == 0, cs[i]));
        continue;
      }
      // Element d's partner d +- D/2: the same lane's element i +- kN/2, or (D = 32) lane d ^ 16.
      if constexpr (kN == 1) {
        partner = __shfl_xor_sync(0xffffffffu, nv[0], 16);
      } else {
        partner = i < kN / 2 ? nv[i + kN / 2] : nv[i - kN / 2];
      }
      dst[d] = float_to_bf16_bits(rope_neox_pair(nv[i], partner, d < kHalf, cs[i]));
    }
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
  MD_REQUIRE(a.qkv && (a.q_norm != nullptr) == (a.k_norm != nullptr) && (a.rope || !a.use_rope) && a.block_table &&
                 a.q && a.k_cache && a.v_cache,
             "prefill qk_norm_rope: null pointer");
  MD_REQUIRE(a.ring_len >= 0, "prefill qk_norm_rope: ring of ", a.ring_len, " blocks");
  MD_REQUIRE(a.cache_pos_offset >= 0 && (a.positions != nullptr || a.cache_pos_offset <= a.start_pos),
             "prefill qk_norm_rope: cache offset ", a.cache_pos_offset, " past the first position ", a.start_pos);
  const int cols = a.n_kv_heads * (a.group_size + 2) * a.head_dim;
  MD_REQUIRE(cols <= kMaxRowFloats, "prefill qk_norm_rope: fused QKV rows of ", cols, " floats, at most ",
             kMaxRowFloats);
  MD_REQUIRE(reinterpret_cast<uintptr_t>(a.qkv) % 16 == 0, "prefill qk_norm_rope: the QKV rows must be 16-byte aligned");
  if (a.n_tokens <= 0) return;
  const size_t smem = static_cast<size_t>(cols) * sizeof(float);
  if (a.head_dim == 32) qk_rope_kernel<32><<<a.n_tokens, kThreads, smem, stream>>>(a);
  else if (a.head_dim == 64) qk_rope_kernel<64><<<a.n_tokens, kThreads, smem, stream>>>(a);
  else qk_rope_kernel<128><<<a.n_tokens, kThreads, smem, stream>>>(a);
  CUDA_CHECK_LAST();
}

}  // namespace megadecode::cuda::prefill
