// What `megadecode plan --simulate` prints and writes: the simulated step (time, SM busy / wait
// fractions, per-layer timeline) and, given a measured trace, the error of every op wave's start
// and end inside the layer.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/layer_timeline.h"
#include "plan/simulate.h"

namespace megadecode {

// The measured side: a trace's per-layer timeline, step time and metadata (backend, batch, ...).
struct MeasuredTimeline {
  LayerTimeline timeline;
  double step_us = 0;  // 0 when the trace does not say
  nlohmann::json meta;
};

// Reads a Chrome trace written by `bench decode --trace` (plain or gzip-compressed JSON) and
// takes its "otherData" (layer_timeline, layer_us, step_us), the timeline recomputed from the
// events where trace_work_slices can (layer_timeline.h); a JSON object that is itself such an
// "otherData" is accepted too (the timelines committed under tests/data). Error otherwise.
MeasuredTimeline read_measured_timeline(const std::string& path);

// sim_params_from_json of a JSON file over `base`; Error naming the file when it is not JSON.
SimParams read_sim_params(const std::string& path, const SimParams& base);

// Error of a prediction in percent of the measured value: (predicted - measured) / measured, with
// the measured value taken as at least 1 us (a wave that starts the layer starts at 0).
double error_pct(double predicted, double measured);

struct WaveError {
  std::string op;
  double start_predicted = 0, start_measured = 0, end_predicted = 0, end_measured = 0;
  double start_err_pct = 0, end_err_pct = 0;
  bool missing = false;  // in one timeline but not the other
};

struct TimelineComparison {
  std::vector<WaveError> waves;  // in the measured timeline's order, then predicted-only waves
  double layer_err_pct = 0;
  double step_err_pct = 0;  // 0 when the trace has no step time
  double worst_abs_pct = 0; // over every wave's start and end and the layer time; 100+ if missing
};

TimelineComparison compare_timelines(const SimResult& predicted, const MeasuredTimeline& measured);

std::string format_simulation(const SimResult& r, const TimelineComparison* cmp);
nlohmann::json simulation_json(const SimResult& r, const SimParams& params, const TimelineComparison* cmp);

}  // namespace megadecode
