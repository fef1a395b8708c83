// check_decode_rows (see decode_rows.h).
#include "engine/decode_rows.h"

#include <algorithm>

#include "core/check.h"
#include "sampling/token_mask.h"

namespace megadecode {

BatchState check_decode_rows(std::span<const DecodeSeq> seqs, const ModelConfig& c, int n_kv_blocks,
                             int kv_block_size, RingPoolShape ring) {
  BatchState batch;
  batch.kv_block_size = kv_block_size;
  batch.seqs.reserve(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    if (ring.ring_len == 0) require_no_ring_table(s.chunk, "decode");
    if (s.prev_row >= 0) {
      MD_REQUIRE(s.chunk.tokens.empty(), "decode: sequence ", i, " is chained to row ", s.prev_row,
                 " and has its own token");
    } else {
      MD_REQUIRE(s.chunk.tokens.size() == 1, "decode: sequence ", i, " has ", s.chunk.tokens.size(),
                 " tokens, expected 1");
      MD_REQUIRE(s.chunk.tokens[0] >= 0 && s.chunk.tokens[0] < c.vocab_size, "decode: sequence ", i, ": token ",
                 s.chunk.tokens[0], " outside the vocabulary");
    }
    MD_REQUIRE(s.chunk.start_pos >= 0 && s.chunk.start_pos < c.max_position_embeddings, "decode: sequence ", i,
               ": position ", s.chunk.start_pos, " outside [0, ", c.max_position_embeddings, ")");
    sampling::validate(s.sampling);
    sampling::check_token_mask(s.allowed, static_cast<size_t>(c.vocab_size));
    const int n_ctx = s.chunk.start_pos + 1;
    const size_t need = (static_cast<size_t>(n_ctx) + kv_block_size - 1) / kv_block_size;
    MD_REQUIRE(s.chunk.block_table.size() >= need, "decode: sequence ", i, ": block table covers ",
               s.chunk.block_table.size(), " blocks, position ", s.chunk.start_pos, " needs ", need);
    for (size_t b = 0; b < need; ++b)
      MD_REQUIRE(s.chunk.block_table[b] >= 0 && s.chunk.block_table[b] < n_kv_blocks, "decode: sequence ", i,
                 ": block ", s.chunk.block_table[b], " outside the cache's ", n_kv_blocks, " blocks");
    // The ring blocks the step reads and appends to (plan/planner.cpp check_ring_tables).
    const size_t ring_need =
        ring.ring_len == 0 ? 0
                           : check_ring_table(s.chunk.ring_table, need, ring.ring_len, ring.n_ring_blocks,
                                              cat("decode: sequence ", i));
    batch.seqs.push_back(SeqState{n_ctx, s.chunk.block_table.first(need), s.chunk.ring_table.first(ring_need)});
  }
  return batch;
}

size_t check_ring_table(std::span<const int32_t> ring_table, size_t blocks, int ring_len, int n_ring_blocks,
                        const std::string& who) {
  const size_t need = std::min<size_t>(blocks, ring_len);
  MD_REQUIRE(ring_table.size() >= need && ring_table.size() <= static_cast<size_t>(ring_len), who, ": ring table of ",
             ring_table.size(), " blocks, ",
             ring_len > 0 ? cat("its positions need ", need, " to ", ring_len) : std::string("the model has no sliding layers"));
  for (size_t b = 0; b < need; ++b)
    MD_REQUIRE(ring_table[b] >= 0 && ring_table[b] < n_ring_blocks, who, ": ring block ", ring_table[b],
               " outside the ring pool's ", n_ring_blocks, " blocks");
  return need;
}

}  // namespace megadecode
