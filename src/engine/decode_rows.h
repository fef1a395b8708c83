// The checks a plan-driven backend makes of a decode step's rows, and the plan's view of them
// (BatchState): one token per row (or a chained row, DecodeSeq::prev_row, whose token the device
// holds), positions inside the model, sampling parameters in range, block tables that cover the
// new position with blocks of the cache, and no ring table (require_no_ring_table). An Error names
// the row.
#pragma once

#include <span>

#include "engine/backend.h"
#include "plan/plan.h"

namespace megadecode {

// The returned state's block tables point into the rows' (first blocks_for(n_ctx) entries).
BatchState check_decode_rows(std::span<const DecodeSeq> seqs, const ModelConfig& config, int n_kv_blocks,
                             int kv_block_size);

}  // namespace megadecode
