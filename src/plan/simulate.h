// A timing model of a decode Plan ("predict before you run"): a discrete-event simulation of one
// step, per SM a loader (issues page reads into the SM's page ring) and a consumer (runs the task
// list: counter waits, fixed costs, consumes pages as they land, arrives), with the memory system
// shared by all SMs (per-SM stream cap, the HBM ceiling shared fairly, latencies). Its output is
// the per-layer timeline bench decode's trace summary prints (layer_timeline.h), so a prediction
// and a measurement compare wave by wave. Parameters and where each number comes from:
// simulate_params.cpp; the plan-to-simulation mapping (op classes): simulate_plan.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/layer_timeline.h"
#include "plan/op_table.h"
#include "plan/plan.h"

namespace megadecode {

// How an SM's loader decides what to read.
//   kV1: the v1 producer (mk_producer.cuh): waits on each task's counters itself, prefetching the
//        weight pages of later static GEMM tasks meanwhile but never past an expert drain; drains
//        claim items from queues; a work ring of work_slots records to the consumers.
//   kV2: the v2 loader (v2 design): never waits on a counter; issues the pages of the SM's next
//        tasks in list order whenever a ring slot is free; stops only at routed tasks until the
//        SM computed the layer's routing, prefetching its later static tasks into L2 meanwhile.
enum class SimLoader { kV1, kV2 };

// The attention item's cost: op_us[attn] + KV bytes / kv_gbps on the consumer (v1: the item reads
// its KV itself, not through the page ring), and the last arriver's merge of the splits.
struct SimAttention {
  double kv_gbps = 1;
  double merge_us_per_split = 0;
  bool one_at_a_time = true;   // v1 tc: the next item is claimed when the previous one is done
  bool consumer_waits = true;  // v1 tc: the item waits for its QKV group itself (else the producer)
};

struct SimParams {
  SimLoader loader = SimLoader::kV1;

  // Memory system. A page read is served in issue order per SM at min(sm_stream_gbps, fair share
  // of hbm_gbps among the SMs streaming at that moment) and lands no earlier than its latency
  // after its issue: with R bytes of ring the SM streams at min(R / latency, cap).
  double hbm_gbps = 0;
  double hbm_latency_us = 0;
  double sm_stream_gbps = 0;
  double l2_gbps = 0;  // bytes the v2 loader prefetched into L2 are read at these instead
  double l2_latency_us = 0;
  int ring_pages = 0;           // page ring slots per SM
  int64_t page_bytes = 16384;   // bytes of one page read (weights or KV)
  int work_slots = 4;           // work records the loader may run ahead of the consumers
  double pickup_us = 0;         // consumers: from taking a work record to starting the work
  double consume_gbps = 0;      // a consumer works through landed GEMM pages at this rate

  // Synchronisation. A counter wait is satisfied hop_us after the arrival that reaches its target,
  // seen at the waiter's next poll (polls every poll_us from the start of the wait; 0: at once).
  double hop_us = 0;
  double poll_us = 0;
  double claim_rtt_us = 0;  // v1 producer: one dependent L2 round trip (queue claims, item reads,
                            // gathered activation rows)
  double issue_us = 0;      // v1 producer: its time to issue a page's weight part, or its
                            // activation part

  // Consumer cost of each op: per task or item (GEMM, routed), per token (single-CTA ops).
  std::array<double, kNumOps> op_us{};
  SimAttention attention;

  // v2 loader.
  double routing_us = 0;         // the consumers' top-k + job map after the router wait
  int64_t l2_ahead_bytes = 0;    // L2 prefetch budget per SM during the routing gap

  // Routing: uniform random top-k per token, distinct experts, seeded per layer.
  uint64_t routing_seed = 1;
};

// The calibrated parameters of the v1 megakernel on the H200 (simulate_params.cpp says which are
// measured and which fitted); tc = the tensor-core attention item, else the scalar one.
SimParams v1_h200_params(bool tc_attention);

nlohmann::json sim_params_json(const SimParams& p);
// Overrides the fields present in `j` (same keys as sim_params_json); Error on unknown keys or
// bad values.
SimParams sim_params_from_json(const nlohmann::json& j, SimParams base);

struct SimSmTime {
  double busy_us = 0;  // inside work slices
  double wait_us = 0;  // outside them while the SM's waiter polled a counter
};

struct SimResult {
  double step_us = 0;  // earliest work start to latest work end (as the trace summary)
  double busy_frac = 0, wait_frac = 0, idle_frac = 0;
  std::vector<SimSmTime> sms;
  LayerTimeline timeline;
  int64_t hbm_bytes = 0;  // page bytes read from HBM (ring pages and L2 prefetches)
  int64_t l2_bytes = 0;   // ring page bytes read from L2 (v2 prefetched)
  int64_t events = 0;
  std::vector<WorkSlice> slices;  // every work (task or item) the consumers ran, SM by SM, in time order
};

struct SimPlan;
SimResult simulate(const SimPlan& plan, const SimParams& params);
// Maps the Plan onto the simulator (simulate_plan.h) and runs it.
SimResult simulate_plan(const Plan& plan, const SimParams& params);

}  // namespace megadecode
