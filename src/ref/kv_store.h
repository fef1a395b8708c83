// Paged KV storage of the reference backend: n_blocks physical blocks of block_size tokens, fp32.
// A sequence's block table maps its logical block i (positions [i*B, (i+1)*B)) to a physical
// block; the engine decides which blocks a sequence holds, this class only stores them.
//
// Layout: one buffer [n_layers][2 (K, V)][n_blocks][block_size][n_kv_heads][head_dim] fp32.
// K is stored after k_norm and RoPE (what attention consumes), V as projected.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace megadecode::ref {

class KvStore {
 public:
  KvStore(const ModelConfig& config, int block_size, int n_blocks);

  int block_size() const { return block_size_; }
  int n_blocks() const { return n_blocks_; }
  int token_floats() const { return token_floats_; }  // n_kv_heads * head_dim

  // Where position `pos` of a sequence lives: (physical block, slot in block). Error when the
  // table does not cover `pos` or names a block outside [0, n_blocks).
  struct Slot {
    int block;
    int slot;
  };
  Slot locate(std::span<const int32_t> block_table, int pos) const;

  // [n_kv_heads, head_dim] fp32 of one token in one layer.
  float* key(int layer, Slot s) { return data_.data() + offset(layer, 0, s); }
  float* value(int layer, Slot s) { return data_.data() + offset(layer, 1, s); }
  const float* key(int layer, Slot s) const { return data_.data() + offset(layer, 0, s); }
  const float* value(int layer, Slot s) const { return data_.data() + offset(layer, 1, s); }

  // Sets every stored float (tests poison unwritten storage with NaN).
  void fill(float v);

 private:
  size_t offset(int layer, int kv, Slot s) const {
    return ((static_cast<size_t>(layer) * 2 + kv) * n_blocks_ + s.block) * block_size_ * token_floats_ +
           static_cast<size_t>(s.slot) * token_floats_;
  }

  int n_layers_;
  int block_size_;
  int n_blocks_;
  int token_floats_;
  std::vector<float> data_;  // [n_layers][2][n_blocks][block_size][n_kv_heads][head_dim]
};

}  // namespace megadecode::ref
