// Host entry points of the prefill kernels (one launch each, asynchronous on `stream`): the
// tensor-core GEMM over packed weights (dense and grouped per expert), the norms with their fused
// prologues, q/k norm + RoPE + the paged KV write, causal flash attention over the paged cache,
// and the device-built MoE token lists. PrefillRunner (prefill_runner.h) chains them per layer.
// Rounding points follow the decode megakernel (src/cuda/megakernel): residual stream fp32, norm
// outputs bf16, q/k norms and RoPE fp32 with K and V stored bf16, attention output bf16,
// SiLU(gate)*up bf16, expert outputs fp32. No float atomics: every sum has a fixed order.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/prefill/prefill_index.h"

namespace megadecode::cuda::prefill {

// ---- GEMM (prefill_gemm.cu): Y[token][row] = sum_k W[row][k] X[token][k] ----
enum class GemmEpilogue {
  kStore,     // y fp32 [tokens][y_stride]
  kResidual,  // y fp32 = residual fp32 + W x (y and residual may not alias)
  kSwiGlu,    // W is a fused gate/up matrix (swiglu_col): y bf16 [tokens][y_stride], n_rows / 2 columns
};

struct GemmArgs {
  const uint16_t* w;           // packed [ceil(n_rows/16)][ceil(k/16)][16x16] bf16 (weight_pack.cuh); grouped: expert 0
  int64_t w_expert_stride = 0; // grouped: packed elements between consecutive experts' matrices
  int n_rows = 0;              // weight rows (output features)
  int k = 0;                   // a multiple of 16
  const uint16_t* x = nullptr; // bf16 activation rows [*][x_stride], 16-byte aligned
  int x_stride = 0;            // elements, a multiple of 8
  const int32_t* gather = nullptr;  // nullptr: output row i reads X row i; else X row gather[i]
  int n_tokens = 0;            // dense: output rows [0, n_tokens)
  // Grouped mode (tiles != nullptr): CTA row y runs tiles[y] (expert, slots) when y < *n_tiles;
  // output row i of a tile is slot slot0 + i; the weight matrix is w + expert * w_expert_stride.
  const MoeTile* tiles = nullptr;
  const int32_t* n_tiles = nullptr;  // device scalar
  int tile_capacity = 0;       // grid rows launched (moe_tile_capacity)
  void* y = nullptr;
  int y_stride = 0;            // elements
  const float* residual = nullptr;  // kResidual: [rows][residual_stride]
  int residual_stride = 0;
};
void gemm(const GemmArgs& args, GemmEpilogue epilogue, cudaStream_t stream);

// ---- norms (prefill_norm.cu) ----
// Per token t (one CTA each): v = embed[tokens[t]] (embed_tokens != nullptr: layer 0), or the MoE
// residual h[t] + sum_k w[t][k] * down[slot[t][k]] (k order; the decode megakernel's order); then
// x[t] = v (fp32, when x != nullptr) and out[t] = bf16(bf16(v * rsqrt(mean v^2 + eps)) * norm_w).
struct ResidualNormArgs {
  const int32_t* tokens = nullptr;  // [n_tokens] (embedding mode)
  const uint16_t* embed = nullptr;  // [vocab][hidden] bf16
  int vocab = 0;
  const float* h = nullptr;         // [n_tokens][hidden] fp32 (MoE mode)
  const float* down = nullptr;      // [n_tokens * top_k][hidden] fp32 expert outputs per slot
  const int32_t* token_slot = nullptr;  // [n_tokens][top_k]
  const float* topk_w = nullptr;    // [n_tokens][top_k]
  int top_k = 0;
  int token_begin = 0;              // run tokens [token_begin, n_tokens) (the final norm: the last only)
  int n_tokens = 0;
  int hidden = 0;
  const uint16_t* norm_w = nullptr; // [hidden]
  float eps = 0.0f;
  float* x = nullptr;               // [n_tokens][hidden] fp32 or nullptr
  uint16_t* out = nullptr;          // [n_tokens][hidden] bf16, row t at out + (t - token_begin) * hidden
  int32_t* error = nullptr;         // device word: set to 1 + token index on a token id outside the vocabulary
};
void residual_norm(const ResidualNormArgs& args, cudaStream_t stream);

// ---- q/k norm + RoPE + KV write (prefill_rope.cu) ----
struct QkRopeArgs {
  const float* qkv = nullptr;        // [n_tokens][G * (gs + 2) * D] fp32, fused group-major (qkv_col)
  const uint16_t* q_norm = nullptr;  // [D]
  const uint16_t* k_norm = nullptr;  // [D]
  const float2* rope = nullptr;       // [rope_positions][D / 2] (cos, sin) of each position and frequency
  int rope_positions = 0;
  const int32_t* block_table = nullptr;  // [>= ceil((start_pos + n_tokens) / block_size)]
  int start_pos = 0, n_tokens = 0;
  int n_kv_heads = 0, group_size = 0, head_dim = 0, block_size = 0;
  float eps = 0.0f;
  uint16_t* q = nullptr;             // [n_tokens][G * gs][D] bf16 (rounded once after RoPE)
  uint16_t* k_cache = nullptr;       // this layer's K: [n_blocks][G][block_size][D] bf16
  uint16_t* v_cache = nullptr;       // this layer's V, same layout
};
void qk_norm_rope_store(const QkRopeArgs& args, cudaStream_t stream);

// ---- causal attention over the paged cache (prefill_attention.cu) ----
// Query token t (position start_pos + t), head h of group g attends keys [0, start_pos + t]:
// earlier chunks' and this chunk's K/V, all read from the cache.
struct AttnArgs {
  const uint16_t* q = nullptr;       // [n_tokens][n_heads][D] bf16
  const uint16_t* k_cache = nullptr; // [n_blocks][G][block_size][D] bf16
  const uint16_t* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  int start_pos = 0, n_tokens = 0;
  int n_kv_heads = 0, group_size = 0, head_dim = 0, block_size = 0;
  float scale = 0.0f;                // 1/sqrt(D)
  uint16_t* out = nullptr;           // [n_tokens][n_heads * D] bf16
};
void attention(const AttnArgs& args, cudaStream_t stream);

// ---- MoE token lists (prefill_moe.cu) ----
// From topk_ids [n_tokens][top_k]: counts per expert, slots in (expert, token, k) order (the
// decode DISPATCH order), token_slot[t][k], slot_token[slot], offsets[E + 1] and the tile list of
// the grouped GEMMs. Never syncs with the host. error: set to 1 on an expert id out of range or
// a tile list over capacity.
struct MoeListArgs {
  const int32_t* topk_ids = nullptr;  // [n_tokens][top_k]
  int n_tokens = 0, top_k = 0, n_experts = 0;
  int32_t* rank = nullptr;            // [n_tokens * top_k] scratch: rank of the entry within its expert
  int32_t* counts = nullptr;          // [n_experts]
  int32_t* offsets = nullptr;         // [n_experts + 1]
  int32_t* token_slot = nullptr;      // [n_tokens * top_k]
  int32_t* slot_token = nullptr;      // [n_tokens * top_k]
  MoeTile* tiles = nullptr;           // [tile_capacity]
  int32_t* n_tiles = nullptr;         // device scalar
  int tile_capacity = 0;
  int32_t* error = nullptr;
};
void moe_lists(const MoeListArgs& args, cudaStream_t stream);

}  // namespace megadecode::cuda::prefill
