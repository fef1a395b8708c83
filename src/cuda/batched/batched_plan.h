// Index math of the batched decode step (src/cuda/batched), shared by its kernels and the host so
// the CPU tests (tests/cuda/batched/test_batched_plan.cpp) check what the device computes: how a row's
// context is cut into attention splits, which (row, split, KV group) an attention item is, the row
// buckets whose step graphs are kept, and the block-table stride of a step.
// Plain C++ (MD_HOST_DEVICE), no CUDA types.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace megadecode::cuda::batched {

// ---- attention splits ----
// A row of ctx keys is cut into n splits of len keys (the last one shorter), len a multiple of the
// key tile (16), at least kSplitMinKeys (below 2 x kSplitMinKeys: one split), at most kMaxSplits. The cut
// depends on the row's own context only, so a row's attention (and its merge order) is the same in
// any batch.
constexpr int kKeyTile = 16;
constexpr int kSplitMinKeys = 512;
constexpr int kMaxSplits = 64;

struct SplitShape {
  int n;    // splits, >= 1 for ctx >= 1
  int len;  // keys per split
};
MD_HOST_DEVICE constexpr SplitShape decode_splits(int ctx) {
  if (ctx <= 0) return {0, kKeyTile};
  int n = ctx / kSplitMinKeys;
  if (n < 1) n = 1;
  if (n > kMaxSplits) n = kMaxSplits;
  const int per = (ctx + n - 1) / n;
  const int len = (per + kKeyTile - 1) / kKeyTile * kKeyTile;
  return {(ctx + len - 1) / len, len};  // rounding len up can leave the last split empty: drop it
}

// The keys a decode row reads at one layer: a full layer all ctx of them, a sliding layer of
// window W (> 0) the last min(ctx, W) (keys [ctx - W, ctx): the cpu-ref's first = pos - W + 1).
// A sliding layer's splits cut those keys alone (decode_splits(n)), so the split list of the
// sliding layers is its own prefix (BatchedStep's ring_split_begin).
struct RowKeys {
  int first;  // the first key read
  int n;      // keys read
};
MD_HOST_DEVICE constexpr RowKeys decode_row_keys(int ctx, int window) {
  const int n = window > 0 && ctx > window ? window : ctx;
  return {ctx - n, n};
}

// The table entry that holds position pos: entry pos / block_size of a block table, or, for a
// sliding layer's ring of ring_len blocks (kv/kv_cache.h), entry (pos / block_size) % ring_len.
MD_HOST_DEVICE constexpr int table_entry(int pos, int block_size, int ring_len) {
  return ring_len > 0 ? (pos / block_size) % ring_len : pos / block_size;
}

// Item i of a step (i < split_begin[n_rows] * n_groups) is split p = i / n_groups of KV group
// i % n_groups; split p belongs to the row r with split_begin[r] <= p < split_begin[r + 1]
// (split_begin: the exclusive prefix of each row's decode_splits(ctx).n; padding rows have none).
MD_HOST_DEVICE inline int split_row(const int32_t* split_begin, int n_rows, int p) {
  int lo = 0, hi = n_rows;  // the last r with split_begin[r] <= p
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (split_begin[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

// ---- step graphs ----
// A step runs `bucket(rows)` rows (the rest padding), so one captured graph serves every batch
// of a bucket: multiples of 8 up to 64, of 16 up to 128, of 32 beyond.
MD_HOST_DEVICE constexpr int row_bucket(int rows) {
  const int q = rows <= 64 ? 8 : rows <= 128 ? 16 : 32;
  return (rows + q - 1) / q * q;
}
// Block-table entries per row: the step's largest need rounded up to a power of two (>= 16), so a
// graph is re-captured only when contexts cross a power of two.
MD_HOST_DEVICE constexpr int table_stride(int max_blocks) {
  int s = 16;
  while (s < max_blocks) s *= 2;
  return s;
}

}  // namespace megadecode::cuda::batched
