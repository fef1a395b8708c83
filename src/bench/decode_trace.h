// Turns the megakernel's per-SM trace records (cuda/megakernel/trace.h) of one decode step into a
// Chrome/Perfetto trace JSON: process 0 has one track per SM with a slice per task (op, layer,
// args); process 1 the same SMs' task parts — the counter waits that had to poll and the phases
// (page waits, activation fills, routing, attention prologue and merge), nested in their tasks;
// process 2 the loader warps: their router waits, their routing and the ring waits that blocked.
// Also a summary of the step: the SM time working, waiting on counters, waiting for pages and
// outside any task, and per op the mean task and its parts.
// Times: clock64 mapped onto %globaltimer per SM by least squares, origin at the earliest event.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/megakernel/trace.h"
#include "plan/plan.h"

#include "plan/layer_timeline.h"  // WaveTiming

namespace megadecode {

// Per op: its tasks and what their time went to (SM-us summed over every task of the op).
struct TraceOpTime {
  int64_t n_tasks = 0;
  double task_us = 0;                       // inside the op's tasks
  double wait_us = 0;                       // counter waits inside them
  double phase_us[kNumTracePhases] = {};    // TracePhase parts inside them
};

struct TraceSummary {
  double step_us = 0;     // earliest begin to latest end over all SMs
  double busy_frac = 0;   // SM-time inside tasks, less their counter and page waits / (n_sms x step_us)
  double wait_frac = 0;   // SM-time in counter waits
  double page_frac = 0;   // SM-time waiting for weight pages (kPhasePage)
  double idle_frac = 0;   // the rest: outside any task (start/end skew, the launch)
  int n_sms = 0;
  int64_t n_work = 0, n_wait = 0, n_phase = 0, dropped = 0;
  double timer_granularity_ns = 0;         // smallest nonzero %globaltimer step seen
  double sm_clock_ghz = 0;                 // median over SMs of clock64 cycles per ns (the fit)
  std::map<std::string, TraceOpTime> ops;  // per op label
  int64_t n_loader = 0;                     // loader records (role 2)
  double loader_us[kNumLoaderPhases] = {};  // SM-us per LoaderPhase over the step
  double layer_us = 0;                     // median time from one layer's first work to the next's
  std::vector<WaveTiming> layer_timeline;  // ops in the order they start
};

// The trace's name of a phase ("pages", "fill", "routing", "attn prologue", "attn merge", "combine").
const char* trace_phase_name(int32_t phase);
// ... and of a loader phase ("loader: router wait", "loader: routing", "loader: ring wait").
const char* loader_phase_name(int32_t phase);

// `meta` is copied into the JSON's "otherData" (backend, batch, context, ...).
nlohmann::json trace_to_chrome(std::span<const TraceRecord> records, const Plan& plan, int64_t dropped,
                               const nlohmann::json& meta, TraceSummary* summary = nullptr);

std::string format_trace_summary(const TraceSummary& s);
nlohmann::json layer_timeline_json(const TraceSummary& s);
nlohmann::json trace_ops_json(const TraceSummary& s);  // per op: tasks, task_us, wait_us, <phase>_us

}  // namespace megadecode
