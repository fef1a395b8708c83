// Host entry points of the kernels over token rows (one launch each, asynchronous on `stream`):
// the norms with their fused prologues, q/k norm + RoPE + the paged KV write, causal flash
// attention over the paged cache, and the device-built MoE token lists. PrefillRunner
// (prefill_runner.h) chains them per layer with the GEMM engine (cuda/gemm/gemm.h); the batched
// decode step (cuda/batched) runs the same kernels over one row per sequence.
// Rounding points follow the decode megakernel (src/cuda/megakernel): residual stream fp32, norm
// outputs bf16, q/k norms and RoPE fp32 with K and V stored bf16, attention output bf16,
// SiLU(gate)*up bf16, expert outputs fp32. No float atomics: every sum has a fixed order.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/gemm/gemm_plan.h"
#include "cuda/prefill/attn_work.h"
#include "cuda/prefill/prefill_index.h"

namespace megadecode::cuda::prefill {

// ---- norms (prefill_norm.cu) ----
// Per token t (one CTA each): v = embed[tokens[t]] (embed_tokens != nullptr: layer 0), or the MoE
// residual h[t] + sum_k w[t][k] * down[slot[t][k]] (k order; the decode megakernel's order); then
// x[t] = v (fp32, when x != nullptr) and out[t] = bf16(bf16(v * rsqrt(mean v^2 + eps)) * norm_w).
struct ResidualNormArgs {
  const int32_t* tokens = nullptr;  // [n_tokens] (embedding mode)
  const uint16_t* embed = nullptr;  // [vocab][hidden] bf16
  int vocab = 0;
  const float* h = nullptr;         // [n_tokens][hidden] fp32 (MoE and add modes)
  const float* add = nullptr;       // [n_tokens][hidden] fp32 (add mode: h + add, e.g. the O-proj's output)
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

  // A layer's output as the next norm's input: h + the MoE combine of the expert rows (moe), or h +
  // ffn (a dense layer's FFN output [n_tokens][hidden]; add mode, the sum written to x_sum).
  void layer_output(bool moe, const float* h_rows, const float* ffn, const int32_t* slots, const float* weights,
                    int k, float* x_sum) {
    h = h_rows;
    if (!moe) {
      add = ffn;
      x = x_sum;
      return;
    }
    down = ffn;
    token_slot = slots;
    topk_w = weights;
    top_k = k;
  }
};
void residual_norm(const ResidualNormArgs& args, cudaStream_t stream);

// ---- q/k norm + RoPE + KV write (prefill_rope.cu) ----
// Row t's position is start_pos + t (a prompt piece: one block table for every row), or, with
// `positions`, positions[t] with its own table at block_table + table_offsets[t] (the batched
// step: decode rows and a mixed step's prompt rows; rows whose position is < 0 are padding and
// are skipped).
// A model without q/k norms (cohere2_moe) leaves q_norm and k_norm null: q and k go to RoPE as
// projected. use_rope false (a NoPE layer): q and k are stored as they are, unrotated. A sliding
// layer's rows (ring_len > 0) write their K/V into their ring: table entry (pos / block_size) %
// ring_len (batched_plan.h table_entry).
struct QkRopeArgs {
  const float* qkv = nullptr;        // [n_tokens][G * (gs + 2) * D] fp32, fused group-major (qkv_col)
  const uint16_t* q_norm = nullptr;  // [D] or nullptr (with k_norm): no q/k norms
  const uint16_t* k_norm = nullptr;  // [D]
  const float2* rope = nullptr;       // [rope_positions][D / 2] (cos, sin) of each position and frequency
  int rope_positions = 0;
  bool use_rope = true;
  bool rope_interleaved = false;     // pairs (2i, 2i + 1) with frequency i; false: NeoX halves (i, i + D/2)
  int ring_len = 0;
  // The cache slot of position pos is pos - cache_pos_offset (a sliding layer's prefill scratch,
  // whose position 0 is SlidingPiece::base; RoPE still takes pos).
  int cache_pos_offset = 0;
  const int32_t* block_table = nullptr;  // [>= ceil((start_pos + n_tokens) / block_size)]
  int start_pos = 0, n_tokens = 0;
  const int32_t* positions = nullptr;    // [n_tokens] or nullptr (every position < rope_positions)
  const int32_t* table_offsets = nullptr;  // with positions: [n_tokens] row t's first table entry
  int n_kv_heads = 0, group_size = 0, head_dim = 0, block_size = 0;
  float eps = 0.0f;
  uint16_t* q = nullptr;             // [n_tokens][G * gs][D] bf16 (rounded once after RoPE)
  uint16_t* k_cache = nullptr;       // this layer's K: [n_blocks][G][block_size][D] bf16
  uint16_t* v_cache = nullptr;       // this layer's V, same layout
};
void qk_norm_rope_store(const QkRopeArgs& args, cudaStream_t stream);

// ---- a sliding layer's ring <-> its prefill scratch (prefill_ring.cu) ----
// Copies the K and V rows of positions [begin, end) between the sequence's ring (position p at
// ring entry (p / B) % ring_len, slot p % B) and the linear scratch (position p at scratch block
// (p - base) / B, slot (p - base) % B): ring -> scratch before a piece, scratch -> ring after it
// (prefill_index.h sliding_piece).
struct RingCopyArgs {
  uint16_t* ring_k = nullptr;       // this layer's ring K: [n_ring_blocks][G][B][D] bf16
  uint16_t* ring_v = nullptr;
  const int32_t* ring_table = nullptr;  // [ring_len] device
  int ring_len = 0;
  uint16_t* scratch_k = nullptr;    // [scratch_blocks][G][B][D] bf16
  uint16_t* scratch_v = nullptr;
  int base = 0;                     // the scratch's position 0
  int begin = 0, end = 0;           // positions to copy, all >= base
  bool to_ring = false;             // false: ring -> scratch
  int n_kv_heads = 0, block_size = 0, head_dim = 0;
};
void ring_copy(const RingCopyArgs& args, cudaStream_t stream);

// ---- causal attention over the paged cache (prefill_attention.cu) ----
// Query token t (position start_pos + t), head h of group g attends keys [0, start_pos + t] (a
// sliding layer: the last `window` of them): earlier chunks' and this chunk's K/V, all read from the
// cache (a sliding layer's: a linear scratch, prefill_index.h sliding_piece).
struct AttnArgs {
  const uint16_t* q = nullptr;       // [n_tokens][n_heads][D] bf16
  const uint16_t* k_cache = nullptr; // [n_blocks][G][block_size][D] bf16
  const uint16_t* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  int kv_blocks = 0;                 // blocks of k_cache and v_cache (the TMA maps' extent)
  int start_pos = 0, n_tokens = 0;
  int n_kv_heads = 0, group_size = 0, head_dim = 0, block_size = 0;
  float scale = 0.0f;                // 1/sqrt(D)
  // A sliding-window layer (window > 0, grid mode): query position q reads keys [q - window + 1, q]
  // only; each query tile starts at the key tile of its first token's window (attn_key_begin_tile).
  int window = 0;
  uint16_t* out = nullptr;           // [n_tokens][n_heads * D] bf16
  // key_splits > 1 (prefill_index.h attn_key_splits): each query tile's keys in that many ranges,
  // partials in part_o [q_tiles * G * splits][kAttnRows][D] and part_ml [..][kAttnRows][2] (m, l),
  // then a merge in split order. The result differs from the unsplit one only in rounding.
  int key_splits = 1;
  float* part_o = nullptr;
  float* part_ml = nullptr;
  // Work-list mode (work != nullptr: a mixed step's pieces, replayed from a graph; attn_work.h):
  // work_ctas CTAs per KV group take items work[c], work[c + work_ctas], ... below *n_work; q, out
  // and block_table are the step's bases (an item adds its piece's row0 and table) and start_pos,
  // n_tokens and key_splits come from the item. Split items' partials sit at slot part * G + g of
  // part_o / part_ml; then rows merge_row0 + i (i < merge_rows) merge as merge[i] says.
  const AttnWork* work = nullptr;
  const int32_t* n_work = nullptr;
  int work_ctas = 0;
  const AttnMergeRow* merge = nullptr;
  int merge_row0 = 0, merge_rows = 0;
};
void attention(const AttnArgs& args, cudaStream_t stream);

// ---- MoE token lists (prefill_moe.cu) ----
// From topk_ids [n_tokens][top_k]: counts per expert, slots in (expert, token, k) order (the
// decode DISPATCH order), token_slot[t][k], offsets[E + 1] and the tile list of
// the grouped GEMMs (tiles of at most tile_tokens slots, gemm_plan.h). Never syncs with the host.
// Rows whose positions[t] < 0 (padding of a decode batch) take no slot (token_slot 0). error: set
// to 1 on an expert id out of range or 2 on a tile list over capacity.
struct MoeListArgs {
  const int32_t* topk_ids = nullptr;  // [n_tokens][top_k]
  const int32_t* positions = nullptr; // [n_tokens] or nullptr (every row routed)
  int n_tokens = 0, top_k = 0, n_experts = 0;
  int tile_tokens = 128;              // 8 * the grouped GEMMs' token_groups
  int32_t* rank = nullptr;            // [n_tokens * top_k] scratch: rank of the entry within its expert
  int32_t* counts = nullptr;          // [n_experts]
  int32_t* offsets = nullptr;         // [n_experts + 1]
  int32_t* token_slot = nullptr;      // [n_tokens * top_k]
  gemm::MoeTile* tiles = nullptr;     // [tile_capacity]
  int32_t* n_tiles = nullptr;         // device scalar
  int tile_capacity = 0;
  int32_t* error = nullptr;
  // Optional (x != nullptr): every routed entry's activation row, copied into slot order,
  // x_slots[token_slot[t][k]] = x[t] (row_elems bf16 each, a multiple of 8; strides multiples of
  // 8): the grouped GEMMs read contiguous rows (TMA boxes).
  const uint16_t* x = nullptr;
  int x_stride = 0;
  int row_elems = 0;
  uint16_t* x_slots = nullptr;
  int x_slots_stride = 0;
  // The copy above for rows of `row_elems` packed back to back (strides = row_elems) on both sides.
  void copy_rows(const uint16_t* rows, int n_elems, uint16_t* slots) {
    x = rows;
    x_stride = x_slots_stride = row_elems = n_elems;
    x_slots = slots;
  }
};
void moe_lists(const MoeListArgs& args, cudaStream_t stream);

}  // namespace megadecode::cuda::prefill
