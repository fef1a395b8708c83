#include "ref/kv_store.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode::ref {

KvStore::KvStore(const ModelConfig& config, int block_size, int n_blocks)
    : n_layers_(config.n_layers), block_size_(block_size), n_blocks_(n_blocks), token_floats_(config.kv_size()) {
  MD_REQUIRE(block_size > 0, "KV block size must be positive, got ", block_size);
  MD_REQUIRE(n_blocks > 0, "the number of KV blocks must be positive, got ", n_blocks);
  // Sized in double first so an absurd request is an Error, not an overflowed allocation.
  const double bytes = 4.0 * n_layers_ * 2 * n_blocks_ * block_size_ * token_floats_;
  MD_REQUIRE(bytes <= 0x1p38, "KV store of ", n_blocks, " blocks x ", block_size, " tokens needs ", bytes / 0x1p30,
             " GiB, more than the reference allows (256 GiB)");
  const size_t n = static_cast<size_t>(n_layers_) * 2 * n_blocks_ * block_size_ * token_floats_;
  data_.assign(n, 0.0f);
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

void KvStore::fill(float v) { std::fill(data_.begin(), data_.end(), v); }

}  // namespace megadecode::ref
