// How a static op's row blocks are cut into tiles (QKV, O-proj, router, LM head): tile i of n over
// [rb0, rb0 + n_rbs) takes [rb0 + n_rbs * i / n, rb0 + n_rbs * (i + 1) / n). With n <= n_rbs no tile
// is empty, so a tile's first row block names it (tile_of_begin): an executor indexes a per-tile
// output by the task's first row block, and the task needs no index of its own.
#pragma once

#include <cstdint>

#include "core/bf16.h"  // MD_HOST_DEVICE

namespace megadecode {

MD_HOST_DEVICE inline int32_t tile_begin(int32_t rb0, int32_t n_rbs, int32_t n, int32_t i) {
  return rb0 + static_cast<int32_t>(static_cast<int64_t>(n_rbs) * i / n);
}

// The tile whose first row block is `begin` (0 < n <= n_rbs): the one integer in
// [(begin - rb0) * n / n_rbs, (begin - rb0 + 1) * n / n_rbs), i.e. the ceiling of the first bound.
MD_HOST_DEVICE inline int32_t tile_of_begin(int32_t rb0, int32_t n_rbs, int32_t n, int32_t begin) {
  return static_cast<int32_t>((static_cast<int64_t>(begin - rb0) * n + n_rbs - 1) / n_rbs);
}

}  // namespace megadecode
