// The checks a backend makes of a decode step's rows, and the plan's view of them (BatchState):
// one token per row (or a chained row, DecodeSeq::prev_row, whose token the device holds),
// positions inside the model, sampling parameters in range, token masks (DecodeSeq::allowed) of the
// vocabulary's size allowing a token, block tables that cover the new
// position with blocks of the cache, and ring tables that fit the backend's ring pool (none
// without one: require_no_ring_table). An Error names the row. Used by cpu-mk, the null backend of
// `bench engine` and the CUDA backends; check_ring_table also by the CUDA prefill and batched step.
#pragma once

#include <span>
#include <string>

#include "engine/backend.h"
#include "plan/plan.h"

namespace megadecode {

// The ring pool a backend keeps for sliding-window layers (kv/kv_cache.h): ring_len blocks a
// sequence, n_ring_blocks in all; ring_len 0 without one.
struct RingPoolShape {
  int ring_len = 0;
  int n_ring_blocks = 0;
};

// The returned state's block tables point into the rows' (first blocks_for(n_ctx) entries), and so
// do its ring tables (the entries those blocks use).
BatchState check_decode_rows(std::span<const DecodeSeq> seqs, const ModelConfig& config, int n_kv_blocks,
                             int kv_block_size, RingPoolShape ring = {});

// Error unless a sequence's ring table holds min(ring_len, blocks) blocks of a ring pool of
// n_ring_blocks, ring_len entries at most (none when ring_len is 0: a model without sliding
// layers); `who` starts the message ("decode: sequence 3"). Returns min(ring_len, blocks): the
// entries the positions in those blocks use.
size_t check_ring_table(std::span<const int32_t> ring_table, size_t blocks, int ring_len, int n_ring_blocks,
                        const std::string& who);

}  // namespace megadecode
