// check_decode_rows (see decode_rows.h).
#include "engine/decode_rows.h"

#include "core/check.h"

namespace megadecode {

BatchState check_decode_rows(std::span<const DecodeSeq> seqs, const ModelConfig& c, int n_kv_blocks,
                             int kv_block_size) {
  BatchState batch;
  batch.kv_block_size = kv_block_size;
  batch.seqs.reserve(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    require_no_ring_table(s.chunk, "decode");
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
    const int n_ctx = s.chunk.start_pos + 1;
    const size_t need = (static_cast<size_t>(n_ctx) + kv_block_size - 1) / kv_block_size;
    MD_REQUIRE(s.chunk.block_table.size() >= need, "decode: sequence ", i, ": block table covers ",
               s.chunk.block_table.size(), " blocks, position ", s.chunk.start_pos, " needs ", need);
    for (size_t b = 0; b < need; ++b)
      MD_REQUIRE(s.chunk.block_table[b] >= 0 && s.chunk.block_table[b] < n_kv_blocks, "decode: sequence ", i,
                 ": block ", s.chunk.block_table[b], " outside the cache's ", n_kv_blocks, " blocks");
    batch.seqs.push_back(SeqState{n_ctx, s.chunk.block_table.first(need)});
  }
  return batch;
}

}  // namespace megadecode
