// How the MoE work of a layer is shared out once its routing is known: one formula that every
// executor evaluates alike (the CPU emulator's tiles and every SM of the megakernel), so no task
// dispatches work and nothing is claimed.
//
// Slots: the (token, k) choices of a layer are numbered expert-major, tokens in order inside an
// expert: expert e's tokens occupy slots [offset(e), offset(e) + count(e)), offset = the exclusive
// prefix sum of the counts in expert order. The up output `act` has one row per slot.
// Up units: active expert j (in expert order) owns units [j * up_units, (j + 1) * up_units); unit u
// of expert e is its packed up matrix's 16-row block u (gate columns 8u..8u+7 and the same up
// columns). With shared experts (PlanShape::shared_inter) their MLP's units follow the routed ones:
// unit n_active * up_units + j is its row block j, for every token. Share s of S takes the units
// moe_share(n_active * up_units + shared_units, s, S): contiguous, equal in weight bytes to within
// one unit, and at most two experts at large shares.
// Down shares: share s of S takes the hidden's 16-row blocks moe_share(down_rbs, s, S) over every
// active expert (in expert order), and writes x = h + sum_k w_k down_k for its rows in top-k order
// (parallel blocks: F = sum_k w_k down_k, plus the shared MLP's down rows, halved when averaged).
#pragma once

#include <cstdint>

#include "core/bf16.h"  // MD_HOST_DEVICE

namespace megadecode {

struct MoeShare {
  int32_t begin, end;
};

// Share `share` of `n_shares` of n items: [n*s/S, n*(s+1)/S).
MD_HOST_DEVICE inline MoeShare moe_share(int32_t n, int32_t share, int32_t n_shares) {
  return {static_cast<int32_t>(static_cast<int64_t>(n) * share / n_shares),
          static_cast<int32_t>(static_cast<int64_t>(n) * (share + 1) / n_shares)};
}

}  // namespace megadecode
