// Turns the megakernel's per-SM trace records (cuda/megakernel/trace.h) of one decode step into a
// Chrome/Perfetto trace JSON: process 0 has one track per SM with a slice per Work (op, layer,
// tile) and, in the gaps between them, "wait" slices where the SM's producer was polling a
// counter (dependency stalls shown apart from work); process 1 has every producer wait in full
// (many overlap the previous Work: those are hidden by prefetch). Also a summary of the step:
// busy / waiting / idle fractions of the SM time, and busy time per op.
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

struct TraceSummary {
  double step_us = 0;    // earliest begin to latest end over all SMs
  double busy_frac = 0;  // SM-time inside Work slices / (n_sms x step_us)
  double wait_frac = 0;  // SM-time idle while the producer polled a counter
  double idle_frac = 0;  // the rest (waiting for pages or work records, start/end skew)
  int n_sms = 0;
  int64_t n_work = 0, n_wait = 0, dropped = 0;
  double timer_granularity_ns = 0;         // smallest nonzero %globaltimer step seen
  std::map<std::string, double> busy_us;   // per op, summed over SMs
  std::map<std::string, double> stall_us;  // wait slices per waiting op, summed over SMs
  double layer_us = 0;                     // median time from one layer's first work to the next's
  std::vector<WaveTiming> layer_timeline;  // ops in the order they start
};

// `meta` is copied into the JSON's "otherData" (backend, batch, context, ...).
nlohmann::json trace_to_chrome(std::span<const TraceRecord> records, const Plan& plan, int64_t dropped,
                               const nlohmann::json& meta, TraceSummary* summary = nullptr);

std::string format_trace_summary(const TraceSummary& s);
nlohmann::json layer_timeline_json(const TraceSummary& s);

}  // namespace megadecode
