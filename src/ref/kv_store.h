// Paged KV storage of the reference backend, fp32, in up to two pools (kv/kv_cache.h):
//  - the full pool: n_blocks physical blocks of block_size tokens; a sequence's block table maps
//    its logical block i (positions [i*B, (i+1)*B)) to a physical block;
//  - the ring pool (models with sliding-window layers, n_ring_blocks > 0): those layers' K/V, a
//    ring of R = kv_ring_length(max window, B) blocks a sequence; position p lives in ring block
//    ring_table[(p / B) % R], slot p % B.
// Without a ring pool (n_ring_blocks 0) every layer, sliding or not, keeps every position in the
// full pool: the layout before rings, kept as the oracle the rings are tested against (and the
// layout of tests that drive RefModel directly). The engine decides which blocks a sequence holds;
// this class only stores them.
//
// Layout: [n_full_pool_layers][2 (K, V)][n_blocks][block_size][n_kv_heads][head_dim] fp32, and
// [n_ring_layers][2][n_ring_blocks][block_size][n_kv_heads][head_dim] fp32 for the ring pool.
// K is stored after k_norm and RoPE (what attention consumes), V as projected.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "model/config.h"

namespace megadecode::ref {

class KvStore {
 public:
  KvStore(const ModelConfig& config, int block_size, int n_blocks, int n_ring_blocks = 0);

  int block_size() const { return block_size_; }
  int n_blocks() const { return n_blocks_; }
  int n_ring_blocks() const { return n_ring_blocks_; }
  int ring_length() const { return ring_length_; }      // R; 0 without a ring pool
  bool in_ring(int layer) const { return pool_index_[layer] < 0; }  // a sliding layer, with a ring pool
  int token_floats() const { return token_floats_; }  // n_kv_heads * head_dim

  // Where position `pos` of a sequence lives: (physical block, slot in block). Error when the
  // table does not cover `pos` or names a block outside its pool.
  struct Slot {
    int block;
    int slot;
  };
  Slot locate(std::span<const int32_t> block_table, int pos) const;  // the full pool
  // The ring pool: error without one, or when the ring table holds more than R blocks or fewer
  // than min(R, pos / B + 1).
  Slot locate_ring(std::span<const int32_t> ring_table, int pos) const;
  // Layer `layer`'s slot of `pos`: through the chunk's ring table for a layer in_ring(), else its
  // block table.
  Slot locate(int layer, const SeqChunk& chunk, int pos) const {
    return in_ring(layer) ? locate_ring(chunk.ring_table, pos) : locate(chunk.block_table, pos);
  }
  // Checks that the chunk's tables cover its positions in every pool this store has, and that it
  // carries no ring table when there is no ring pool.
  void check_tables(const SeqChunk& chunk) const;

  // [n_kv_heads, head_dim] fp32 of one token in one layer; `s` from locate(layer, ...).
  float* key(int layer, Slot s) { return at(layer, 0, s); }
  float* value(int layer, Slot s) { return at(layer, 1, s); }
  const float* key(int layer, Slot s) const { return const_cast<KvStore*>(this)->at(layer, 0, s); }
  const float* value(int layer, Slot s) const { return const_cast<KvStore*>(this)->at(layer, 1, s); }

  // Sets every stored float of both pools (tests poison unwritten storage with NaN).
  void fill(float v);

 private:
  float* at(int layer, int kv, Slot s) {
    const int p = pool_index_[layer];
    if (p >= 0) return data_.data() + offset(p, kv, n_blocks_, s);
    return ring_data_.data() + offset(-p - 1, kv, n_ring_blocks_, s);
  }
  size_t offset(int index, int kv, int n_pool_blocks, Slot s) const {
    return ((static_cast<size_t>(index) * 2 + kv) * n_pool_blocks + s.block) * block_size_ * token_floats_ +
           static_cast<size_t>(s.slot) * token_floats_;
  }

  int block_size_;
  int n_blocks_;
  int n_ring_blocks_;
  int ring_length_ = 0;
  int token_floats_;
  std::vector<int> pool_index_;    // [n_layers] i >= 0: layer i of the full pool; -i-1: of the ring pool
  std::vector<float> data_;        // the full pool
  std::vector<float> ring_data_;   // the ring pool
};

}  // namespace megadecode::ref
