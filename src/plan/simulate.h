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

// The attention item's cost on its consumers: op_us[attn] + KV bytes / kv_gbps (the item loads its
// K and V itself, warp by warp, not through the page ring), and the last arriver's merge.
struct SimAttention {
  double kv_gbps = 1;
  double merge_us_per_split = 0;
};

// The megakernel's agents (simulate_agents.cpp): the loader never waits on a counter; it issues the
// weight pages of the SM's tasks in list order whenever a ring slot is free, and stops only at a
// routed task until the SM's consumers computed that layer's routing, prefetching its later tasks'
// weights into L2 meanwhile (up to l2_ahead_bytes), which are then read from L2. The consumers run
// the list: counter waits, the task's fixed cost (its prologue), its pages, arrivals.
struct SimParams {
  // Memory system. A page read is served in issue order per SM at min(sm_stream_gbps, fair share
  // of hbm_gbps among the SMs streaming at that moment) and lands no earlier than its latency
  // after its issue: with R bytes of ring the SM streams at min(R / latency, cap).
  double hbm_gbps = 0;
  double hbm_latency_us = 0;
  double sm_stream_gbps = 0;
  double l2_gbps = 0;  // bytes the loader prefetched into L2 are read at these instead
  double l2_latency_us = 0;
  int ring_pages = 0;           // page ring slots per SM
  int64_t page_bytes = 32768;   // bytes of one page read (one bulk copy)
  double pickup_us = 0;         // consumers: from one task to the next (reading its record)
  double consume_gbps = 0;      // a consumer works through landed GEMM pages at this rate at one
                                // token group (batch <= 8); at g groups, at consume_gbps / g

  // Synchronisation. A counter wait is satisfied hop_us after the arrival that reaches its target,
  // seen at the waiter's next poll (polls every poll_us from the start of the wait; 0: at once).
  double hop_us = 0;
  double poll_us = 0;
  // After a wait that blocked, the work starts a further uniform [0, wait_jitter_us) later, drawn
  // per SM and task from routing_seed: the scatter of work starts a trace shows at every wave (a
  // few us over 132 SMs), which the hop alone does not give.
  double wait_jitter_us = 0;

  // Consumer cost of each op besides its pages: per task (GEMM prologue, routed share), per token
  // (SAMPLE), after the task's waits; and before them (per task, or per attention item): what the
  // kernel does first (the up task's norm fill, an attention item's first K/V loads).
  std::array<double, kNumOps> op_us{};
  std::array<double, kNumOps> pre_wait_us{};
  // What grows with the token rows of the step, per row beyond the first up to 8 (one token
  // group; the batch-1 and batch-8 traces are what measured it; beyond 8 the windows and token
  // groups are modelled by fill_us and consume_gbps): a GEMM task's activation fill and epilogue
  // (added to op_us; the up share's to its pre-wait fill, when it has one).
  std::array<double, kNumOps> row_us{};
  SimAttention attention;

  // Activation fills beyond a task's first, fill_us of consumer time each, where the kernel's
  // GEMM geometry (plan/gemm_geometry.h) makes them: a job whose K needs several windows (at
  // batch >= 9 for O-proj's K 4096, >= 17 for the hidden-K ops) refills the window for every
  // window of every page group (an up share: every fill counts, it has no whole-K fill then); a
  // down share refills for every group of experts' rows that fits the area, per row block.
  double fill_us = 0;

  // An expert share runs one job per expert it covers (the expert's activation rows, its
  // epilogue): job_us of consumer time each, besides op_us.
  double job_us = 0;

  double routing_us = 0;       // the consumers' top-k + share map after the router wait, per 8
                               // tokens (one warp per token)
  double routing_token_us = 0; // and per token beyond the first, up to 8 (as row_us)
  int64_t l2_ahead_bytes = 0;  // L2 prefetch budget per SM during the routing gap

  // Routing: uniform random top-k per token, distinct experts, seeded per layer. The seed also
  // draws the wait scatter (wait_jitter_us).
  uint64_t routing_seed = 1;
};

// The parameters of the megakernel (v3) on the H200, calibrated on its batch-1 trace
// (simulate_params.cpp says which are measured phases, which fitted, which assumed).
SimParams v3_h200_params();
// The same kernel on the H100 (its memory system; simulate_params.cpp says what is scaled).
SimParams v3_h100_params();
// By name: "h100" or "h200"; Error on others.
SimParams sim_params_for_gpu(const std::string& gpu);

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
