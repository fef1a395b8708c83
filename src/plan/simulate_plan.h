// The simulator's view of a decode step (SimPlan): per SM the list of tasks with what their
// consumers wait for, cost and arrive at, and the bytes their loader streams; the drain queues of
// v1 plans. simulate_plan.cpp builds it from a Plan through ONE table that gives each op its class
// (and for GEMM ops its weight bytes); the engine knows classes, never ops. Tests build SimPlans
// by hand.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/simulate.h"

namespace megadecode {

// What the engine needs to know about an op.
//   kTiny:      single-CTA work of a fixed cost per token (norms, DISPATCH, SAMPLE): no pages.
//   kGemm:      a static weight tile: its pages are known before its waits (v1 prefetches them).
//   kAttention: attention items (v1: claimed from the host-built queue; v2: the SM's own items).
//   kRouted:    expert work: its pages are known only once the layer's routing is (v1: items
//               DISPATCH puts in a queue; v2: jobs of the routing formula); loaders stop here.
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

// An attention item or an expert job: pages of its own and a cost; it may take part in a split
// merge: it adds 1 to split_counter, and the one that brings it to n_splits also spends merge_us
// and makes merge_arrives (the last-arriver merge of attention splits).
struct SimItem {
  int64_t bytes = 0;     // streamed through the page ring
  double cost_us = 0;    // consumer time besides consuming pages
  int x_rows = 0;         // v1: activation rows the producer copies into each page (one copy each)
  bool gathered = false;  // v1: each row's index is a dependent L2 load first (expert up)
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
  int64_t bytes = 0;     // the task's own pages (GEMM weights)
  double cost_us = 0;    // consumer time besides consuming pages
  int x_rows = 0;        // v1: activation rows the producer copies into each page
  int queue = -1;        // v1 drain: items are claimed from SimPlan::queues[queue]
  std::vector<SimItem> items;     // v2: the task's own items, run in order after its pages
  bool computes_routing = false;  // v2: after its waits the consumers compute the layer's routing
                                  // (routing_us), which lets the loader past the layer's routed tasks
};

// A v1 drain queue. Claiming costs claim_round_trips dependent L2 round trips (the atomic, then
// the item's data) after prologue_round_trips once per drain task (v1 experts read the count).
struct SimQueue {
  std::vector<SimItem> items;
  int claim_round_trips = 1;
  int prologue_round_trips = 0;
  bool one_at_a_time = false;        // claim the next item only when the consumers finished this one
  bool consumer_waits = false;       // the item's waits are the consumers' (else the producer's)
  bool weights_before_wait = false;  // issue the item's weight pages into free slots before its wait
};

struct SimPlan {
  int n_sms = 0;
  int n_counters = 0;
  std::vector<std::vector<SimTask>> lists;  // [n_sms]
  std::vector<SimQueue> queues;
};

// The v1 Plan under the given parameters: GEMM weights from the task geometry, attention items
// from plan.attn_items (cost from params.attention), expert items from a seeded uniform routing
// (what DISPATCH would build, with its credits for inactive experts as its arrivals).
SimPlan sim_plan_from_plan(const Plan& plan, const SimParams& params);

// The layer's active experts and tokens per expert under the simulated routing.
std::vector<int> sim_routing_counts(const PlanShape& shape, int layer, uint64_t seed);

}  // namespace megadecode
