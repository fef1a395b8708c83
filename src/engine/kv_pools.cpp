// Sizing the KV pools (see kv_pools.h).
#include "engine/kv_pools.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kv/kv_cache.h"

namespace megadecode {

KvPoolShape kv_pool_shape(const ModelConfig& config, int block_size, int elem_bytes) {
  MD_REQUIRE(block_size > 0 && elem_bytes > 0, "KV pool: block size ", block_size, " and element size ", elem_bytes,
             " must be positive");
  KvPoolShape s;
  s.n_ring_layers = config.n_sliding_layers();
  s.n_full_layers = config.n_layers - s.n_ring_layers;
  s.ring_length = kv_ring_length(config.max_sliding_window(), block_size);
  const int64_t per_layer = int64_t{2} * config.n_kv_heads * block_size * config.head_dim * elem_bytes;
  s.full_block_bytes = s.n_full_layers * per_layer;
  s.ring_block_bytes = s.n_ring_layers * per_layer;
  return s;
}

KvPoolSizes size_kv_pools(const KvPoolShape& shape, double budget_bytes, int max_seqs, int64_t n_blocks,
                          int64_t n_ring_blocks) {
  MD_REQUIRE(n_blocks >= 0 && n_ring_blocks >= 0, "KV pool sizes must be >= 0, got ", n_blocks, " and ",
             n_ring_blocks);
  MD_REQUIRE(max_seqs >= 1, "KV pools for ", max_seqs, " sequences");
  MD_REQUIRE(std::isfinite(budget_bytes) && budget_bytes >= 0, "KV pool budget of ", budget_bytes, " bytes");
  MD_REQUIRE(shape.full_block_bytes > 0 && shape.ring_block_bytes >= 0 &&
                 (shape.ring_block_bytes > 0) == (shape.ring_length > 0),
             "KV pool shape: full blocks of ", shape.full_block_bytes, " bytes, ring blocks of ",
             shape.ring_block_bytes, " bytes, ring length ", shape.ring_length);
  constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  const bool ring = shape.ring_length > 0;
  const int64_t ring_cap = ring ? int64_t{max_seqs} * shape.ring_length : 0;  // what resident sequences can hold
  const auto fb = static_cast<double>(shape.full_block_bytes), rb = static_cast<double>(shape.ring_block_bytes);
  // The full pool's blocks left by a ring pool of `ring_blocks`.
  auto full_left = [&](int64_t ring_blocks) {
    const double left = budget_bytes - static_cast<double>(ring_blocks) * rb;
    return left > 0 ? static_cast<int64_t>(std::min(std::floor(left / fb), static_cast<double>(kMaxBlocks))) : int64_t{0};
  };
  KvPoolSizes out;
  if (n_blocks > 0) {
    out.n_blocks = n_blocks;
  } else if (!ring || n_ring_blocks > 0) {  // the ring (if any) is fixed: the full pool takes what remains
    out.n_blocks = full_left(n_ring_blocks);
  } else if (budget_bytes >= static_cast<double>(ring_cap) * (fb + rb)) {  // a full ring pool, the rest full blocks
    out.n_blocks = full_left(ring_cap);
  } else if (budget_bytes >= static_cast<double>(shape.ring_length) * (fb + rb)) {  // a ring block per full block
    out.n_blocks = static_cast<int64_t>(std::floor(budget_bytes / (fb + rb)));
  } else {  // less than a ring per full block: one ring, the rest full blocks
    out.n_blocks = full_left(shape.ring_length);
  }
  if (ring)
    out.n_ring_blocks =
        n_ring_blocks > 0 ? n_ring_blocks : std::max<int64_t>(shape.ring_length, std::min(out.n_blocks, ring_cap));
  return out;
}

}  // namespace megadecode
