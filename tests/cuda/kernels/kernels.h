// Host entry points of the kernels only the GPU tests launch: standalone versions of device
// routines (q/k norm + RoPE, paged decode attention and its split merge, SiLU*up, the MoE combine,
// the four-pass sampler, the packed synthetic fill), each checked against a CPU reference.
// One launch each (several for sampling), asynchronous on `stream`. Invalid shapes or arguments
// are a megadecode::Error naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace megadecode::cuda {

// ---- weights (cuda/common/weight_pack.cuh) ----
// Writes packed weights directly: element (row, k) = bf16(scale * uniform_at(seed, stream_id, row*k_total + k)),
// i.e. the same values as a row-major tensor filled from uniform_at and then packed.
void fill_packed_uniform(uint16_t* packed, int n_rows, int k, uint64_t seed, uint64_t stream_id, float scale,
                         cudaStream_t stream);

// ---- per-head q/k norm + RoPE + KV append (cuda/common/qk_norm_rope.cuh) ----
// Paged KV cache of one layer, K and V each: [n_blocks][n_kv_heads][block_size][head_dim] bf16.
// Token t of a sequence lives in physical block block_table[seq][t / block_size], slot t % block_size.
struct QkNormRopeArgs {
  const float* qkv;            // [n_tokens][qkv_stride] fp32: n_heads q heads, n_kv_heads k, n_kv_heads v
  int qkv_stride;
  const uint16_t* q_norm;      // [head_dim] bf16 (nullptr: no q/k norm)
  const uint16_t* k_norm;      // [head_dim] bf16
  const int32_t* positions;    // [n_tokens] position of the token (= its slot in the sequence)
  const int32_t* block_table;  // [n_tokens][max_blocks] physical block ids
  int max_blocks;
  uint16_t* q_out;             // [n_tokens][n_heads][head_dim] bf16
  uint16_t* k_cache;           // [n_blocks][n_kv_heads][block_size][head_dim] bf16
  uint16_t* v_cache;           // same layout
  int n_tokens, n_heads, n_kv_heads, head_dim, block_size;
  float eps;
  float rope_theta;
};
void qk_norm_rope(const QkNormRopeArgs& args, cudaStream_t stream);

// ---- paged decode attention (attention.cuh) ----
struct AttentionArgs {
  const uint16_t* q;             // [n_seqs][n_heads][head_dim] bf16
  const uint16_t* k_cache;       // [n_blocks][n_kv_heads][block_size][head_dim] bf16
  const uint16_t* v_cache;       // same layout
  const int32_t* block_table;    // [n_seqs][max_blocks]
  const int32_t* context_lens;   // [n_seqs] keys attended (the new token included)
  int max_blocks, n_seqs, n_heads, n_kv_heads, head_dim, block_size;
  int n_splits;                  // KV splits per (sequence, kv head); split s = attention_split_range()
  float scale;                   // usually 1/sqrt(head_dim)
  float* o_part;                 // [n_seqs][n_heads][n_splits][head_dim] fp32, unnormalised sum p*v
  float* ml_part;                // [n_seqs][n_heads][n_splits][2]: max (log2 units of scale*q.k), sum of 2^(s-max)
};
void attention_decode(const AttentionArgs& args, cudaStream_t stream);
// out[seq][head*head_dim + d] bf16 = merged attention output (log-sum-exp over splits, split order).
void attention_merge(const float* o_part, const float* ml_part, uint16_t* out, int n_seqs, int n_heads, int n_splits,
                     int head_dim, cudaStream_t stream);

// ---- MoE pieces (cuda/common/moe.cuh) ----
// out[r][i] = bf16( silu(gate_up[r][i]) * gate_up[r][inter + i] ), gate_up [n_rows][gate_up_stride] fp32.
void silu_mul(const float* gate_up, int gate_up_stride, uint16_t* out, int out_stride, int n_rows, int inter,
              cudaStream_t stream);
// out[t][h] = residual[t][h] + sum_{k in 0..top_k-1, in order} w[t][k] * parts[t*top_k + k][h]
// (w == nullptr: weight 1). parts [n_tokens*top_k][n] fp32; residual/out [n_tokens][n] fp32 (may alias).
void moe_combine(const float* parts, const float* weights, const float* residual, float* out, int n_tokens, int top_k,
                 int n, cudaStream_t stream);

// ---- sampling (cuda/common/sampling.cuh) ----
struct DeviceSamplingParams {  // one per row
  float temperature;           // below kGreedyTemperature: greedy
  int32_t top_k;               // <= 0: off
  float top_p;                 // 1: off
  float min_p;                 // 0: off
  uint64_t seed;
  int64_t position;            // the position the sampled token takes
};
// tokens[r] = sample_row's token for logits[r][0..vocab) under params[r], one CTA of `threads`
// threads per row: 256 is the megakernel's consumer count (what its SAMPLE op runs), 1024 a
// standalone CTA.
void sample_tokens(const float* logits, int logits_stride, int n_rows, int vocab, const DeviceSamplingParams* params,
                   int32_t* tokens, int threads, cudaStream_t stream);

}  // namespace megadecode::cuda
