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
// unit n_active * up_units + j is its row block j, for every token.
// A share task (expert up or down, dense up or down) has args (a0, a1, T): the weight units
// [a0, a1) of T, and takes the items moe_share(n, a0, a1, T) = [n*a0/T, n*a1/T): contiguous, and
// in proportion to its weight to within one item. The shares of one op and layer tile [0, T)
// (validator). Equal shares are (s, s + 1, S); the planner weights a parallel block's up shares by
// the attention beside them (planner_assemble.cpp balance_up_shares).
// Up shares take the units moe_share(n_active * up_units + shared_units, a0, a1, T).
// Down shares take the hidden's 16-row blocks moe_share(down_rbs, a0, a1, T) over every active
// expert (in expert order), and write x = h + sum_k w_k down_k for their rows in top-k order
// (parallel blocks: F = sum_k w_k down_k, plus the shared MLP's down rows, halved when averaged).
#pragma once

#include <cstdint>

#include "core/bf16.h"  // MD_HOST_DEVICE

namespace megadecode {

struct MoeShare {
  int32_t begin, end;
};

// The items [n*a0/T, n*a1/T) of n: weight units [a0, a1) of T (0 <= a0 <= a1 <= T).
MD_HOST_DEVICE inline MoeShare moe_share(int32_t n, int32_t a0, int32_t a1, int32_t total) {
  return {static_cast<int32_t>(static_cast<int64_t>(n) * a0 / total),
          static_cast<int32_t>(static_cast<int64_t>(n) * a1 / total)};
}

}  // namespace megadecode
