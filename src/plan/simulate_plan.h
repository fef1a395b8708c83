// The simulator's view of a decode step (SimPlan): per SM the list of tasks with what their
// consumers wait for, cost and arrive at, and the bytes their loader streams. simulate_plan.cpp
// builds it from a Plan through ONE table that gives each op its class (and for GEMM ops its
// weight bytes); the engine knows classes, never ops. Tests build SimPlans by hand.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/simulate.h"

namespace megadecode {

// What the engine needs to know about an op.
//   kTiny:      work of a fixed cost per token (SAMPLE): no pages.
//   kGemm:      a static weight tile: its pages are known before its waits.
//   kAttention: an attention item (its KV is read by the consumers, not through the ring).
//   kRouted:    an expert share: its pages are known only once the layer's routing is; the loader
//               stops here until the SM's consumers computed it.
enum class SimClass : uint8_t { kTiny, kGemm, kAttention, kRouted };
SimClass sim_class(Op op);

struct SimWait {
  int32_t counter;
  int32_t target;
};
struct SimArrive {
  int32_t counter;
  int32_t amount;
};

// An attention item: pages of its own (none in the megakernel) and a cost; it takes part in a split
// merge: it adds 1 to split_counter, and the one that brings it to n_splits also spends merge_us
// and makes merge_arrives (the last-arriver merge of attention splits).
struct SimItem {
  int64_t bytes = 0;     // streamed through the page ring
  double pre_us = 0;     // consumer time before its waits
  double cost_us = 0;    // consumer time besides consuming pages, after them
  std::vector<SimWait> waits;
  std::vector<SimArrive> arrives;
  int32_t split_counter = -1;
  int32_t n_splits = 0;
  double merge_us = 0;
  std::vector<SimArrive> merge_arrives;
};

struct SimTask {
  Op op = Op::kQkv;
  int layer = -1;
  SimClass cls = SimClass::kTiny;
  std::vector<SimWait> waits;
  std::vector<SimArrive> arrives;
  int64_t bytes = 0;     // the task's own pages (GEMM weights, an expert share's weights)
  double pre_us = 0;     // consumer time before its waits (after the first pre_after_waits of them)
  int pre_after_waits = 0;
  double cost_us = 0;    // consumer time besides consuming pages, after them
  std::vector<SimItem> items;     // the task's own items (attention), run in order after its pages
  bool computes_routing = false;  // after its waits the consumers compute the layer's routing
                                  // (routing_us x routing_rounds), which lets the loader past the
                                  // layer's routed tasks
  int routing_rounds = 1;         // rounds of 8 tokens (one per consumer warp)
  int routing_rows = 1;           // tokens of the first round (routing_token_us for each beyond one)
};

struct SimPlan {
  int n_sms = 0;
  int n_counters = 0;
  // The kernel instantiation's token groups of 8 (plan/gemm_geometry.h token_groups): a page's
  // MMAs and B-fragment loads are per group, so consumers take token_groups x bytes / consume_gbps.
  int token_groups = 1;
  std::vector<std::vector<SimTask>> lists;  // [n_sms]
};

// The Plan under the given parameters: GEMM weights from the task geometry, attention items from
// plan.attn_items (cost from params.attention), expert shares from a seeded uniform routing and the
// share formula of plan/moe_split.h.
SimPlan sim_plan_from_plan(const Plan& plan, const SimParams& params);

// The layer's active experts and tokens per expert under the simulated routing.
std::vector<int> sim_routing_counts(const PlanShape& shape, int layer, uint64_t seed);

}  // namespace megadecode
