// Paged decode attention for many sequences (split-K): one query token per row attends to the
// row's seq_lens[r] keys in the paged cache (a sliding-window layer: the last `window` of them, read
// from the row's ring of blocks). Each row's keys are cut into splits (batched_plan.h
// decode_splits: its own context only); an item is (split, KV group): the group's query heads are
// the MMA rows, so every K/V tile is read once for them. Two launches: persistent CTAs walk the
// items (each of 4 warps streams its own 16-key tiles of the item with cp.async, double-buffered
// across item boundaries; S = Q K^T and O += P V on mma.sync m16n8k16, online softmax in base 2 from
// cuda/common/attention_state.cuh; the warps' states merge in warp order), then one CTA per
// (row, head) merges the row's splits in split order (log-sum-exp) into bf16.
// Rounding: q, K, V and P are bf16 MMA inputs (as the prefill attention); the output is bf16.
// Determinism: nothing depends on the other rows or on which CTA ran an item.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace megadecode::cuda::batched {

struct DecodeAttnArgs {
  const uint16_t* q = nullptr;         // [n_rows][n_kv_heads * group_size][head_dim] bf16
  const uint16_t* k_cache = nullptr;   // this layer's K: [n_blocks][n_kv_heads][block_size][head_dim] bf16
  const uint16_t* v_cache = nullptr;   // this layer's V, same layout
  const int32_t* block_tables = nullptr;  // [n_rows][table_stride]
  int table_stride = 0;
  const int32_t* seq_lens = nullptr;   // [n_rows] keys of each row (0: a padding row)
  const int32_t* split_begin = nullptr;  // [n_rows + 1] exclusive prefix of decode_splits(seq_lens[r]).n
  int n_rows = 0;
  int n_kv_heads = 0, group_size = 0, head_dim = 0, block_size = 0;
  // A sliding-window layer: window > 0 keys at most a row (decode_row_keys; split_begin is then the
  // prefix of the windowed splits), and, with ring_len > 0, block_tables are the rows' ring tables
  // (table_stride = ring_len, key pos in entry (pos / block_size) % ring_len, batched_plan.h).
  int window = 0;
  int ring_len = 0;
  float scale = 0.0f;                  // 1/sqrt(head_dim)
  float* part_o = nullptr;             // [split_capacity][n_heads][head_dim] fp32 unnormalised outputs
  float* part_ml = nullptr;            // [split_capacity][n_heads][2] (max, sum) in the log2 domain
  int split_capacity = 0;              // >= split_begin[n_rows] (the caller sized it)
  uint16_t* out = nullptr;             // [n_rows][n_heads * head_dim] bf16 (padding rows: zeros)
};

// Error for unsupported shapes (head_dim 32/64/128, group_size 1..8) or null pointers; then the
// two launches on `stream`.
void decode_attention(const DecodeAttnArgs& args, cudaStream_t stream);

}  // namespace megadecode::cuda::batched
