#include "ref/kv_store.h"

#include <algorithm>

#include "core/check.h"
#include "kv/kv_cache.h"

namespace megadecode::ref {

KvStore::KvStore(const ModelConfig& config, int block_size, int n_blocks, int n_ring_blocks)
    : block_size_(block_size), n_blocks_(n_blocks), n_ring_blocks_(n_ring_blocks), token_floats_(config.kv_size()) {
  MD_REQUIRE(block_size > 0, "KV block size must be positive, got ", block_size);
  MD_REQUIRE(n_blocks > 0, "the number of KV blocks must be positive, got ", n_blocks);
  MD_REQUIRE(n_ring_blocks >= 0, "the number of KV ring blocks must be >= 0, got ", n_ring_blocks);
  MD_REQUIRE(static_cast<int>(config.layers.size()) == config.n_layers, "config has ", config.layers.size(),
             " layer specs for ", config.n_layers, " layers");
  const int window = config.max_sliding_window();
  MD_REQUIRE(n_ring_blocks == 0 || window > 0, "a KV ring pool of ", n_ring_blocks, " blocks for ", config.model_type,
             ", which has no sliding-window layer");
  if (n_ring_blocks > 0) ring_length_ = kv_ring_length(window, block_size);
  int n_full = 0, n_ring = 0;
  pool_index_.resize(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l)
    pool_index_[l] = ring_length_ > 0 && config.is_sliding_layer(l) ? -(++n_ring) : n_full++;
  // Sized in double first so an absurd request is an Error, not an overflowed allocation.
  const double bytes = 4.0 * 2 * block_size_ * token_floats_ * (double(n_full) * n_blocks_ + double(n_ring) * n_ring_blocks_);
  MD_REQUIRE(bytes <= 0x1p38, "KV store of ", n_blocks, " blocks (and ", n_ring_blocks, " ring blocks) x ", block_size,
             " tokens needs ", bytes / 0x1p30, " GiB, more than the reference allows (256 GiB)");
  const size_t block_floats = static_cast<size_t>(2) * block_size_ * token_floats_;
  data_.assign(static_cast<size_t>(n_full) * n_blocks_ * block_floats, 0.0f);
  ring_data_.assign(static_cast<size_t>(n_ring) * n_ring_blocks_ * block_floats, 0.0f);
}

KvStore::Slot KvStore::locate(std::span<const int32_t> block_table, int pos) const {
  MD_REQUIRE(pos >= 0, "negative position ", pos);
  const size_t logical = static_cast<size_t>(pos / block_size_);
  MD_REQUIRE(logical < block_table.size(), "block table of ", block_table.size(), " blocks does not cover position ",
             pos, " (block size ", block_size_, ")");
  const int32_t block = block_table[logical];
  MD_REQUIRE(block >= 0 && block < n_blocks_, "block table entry ", logical, " names block ", block,
             ", outside [0, ", n_blocks_, ")");
  return Slot{block, pos % block_size_};
}

KvStore::Slot KvStore::locate_ring(std::span<const int32_t> ring_table, int pos) const {
  MD_REQUIRE(ring_length_ > 0, "a ring table read from a KV store without a ring pool");
  MD_REQUIRE(pos >= 0, "negative position ", pos);
  const int logical = pos / block_size_;
  const size_t need = static_cast<size_t>(std::min(logical + 1, ring_length_));
  MD_REQUIRE(ring_table.size() >= need && ring_table.size() <= static_cast<size_t>(ring_length_), "ring table of ",
             ring_table.size(), " blocks for position ", pos, ": needs ", need, " to ", ring_length_,
             " (ring length ", ring_length_, ", block size ", block_size_, ")");
  const int index = logical % ring_length_;
  const int32_t block = ring_table[index];
  MD_REQUIRE(block >= 0 && block < n_ring_blocks_, "ring table entry ", index, " names block ", block,
             ", outside [0, ", n_ring_blocks_, ")");
  return Slot{block, pos % block_size_};
}

void KvStore::check_tables(const SeqChunk& chunk) const {
  MD_REQUIRE(ring_length_ > 0 || chunk.ring_table.empty(), "sequence ", chunk.seq_id, ": a ring table of ",
             chunk.ring_table.size(), " blocks for a KV store without a ring pool");
  const int end = chunk.start_pos + static_cast<int>(chunk.tokens.size());
  for (int p = chunk.start_pos; p < end; ++p) {
    locate(chunk.block_table, p);
    if (ring_length_ > 0) locate_ring(chunk.ring_table, p);
  }
}

void KvStore::fill(float v) {
  std::fill(data_.begin(), data_.end(), v);
  std::fill(ring_data_.begin(), ring_data_.end(), v);
}

}  // namespace megadecode::ref
