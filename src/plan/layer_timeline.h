// The per-layer timeline of a decode step: for each op's wave inside a layer, when its first work
// starts and its last work ends, medians over the middle layers. One home for the measured
// timeline (bench decode's trace summary) and the predicted one (plan --simulate), so the two
// are computed, printed and compared the same way.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megadecode {

// One op's wave inside a layer, medians over the middle layers (the first and last differ): when
// its first work starts and its last work ends (us from the layer's first work), the gap after the
// previous op's last end (the dependency hop; negative when they overlap), and its items' times.
struct WaveTiming {
  std::string op;
  double start_us = 0, end_us = 0, gap_us = 0;
  double item_p50_us = 0, item_max_us = 0;
  int items = 0;
};

struct LayerTimeline {
  double layer_us = 0;             // median time from one layer's first work to the next's
  std::vector<WaveTiming> waves;   // ops in the order they start
};

// One work slice: op (an Op value), layer (< 0: outside the layers, ignored), times in us.
struct WorkSlice {
  int op;
  int layer;
  double t0_us, t1_us;
};

LayerTimeline layer_timeline(std::span<const WorkSlice> slices);

// The work slices of a bench decode --trace event list (Chrome trace events): every task (pid 0,
// named "<op>" or "<op> L<layer>") from the end of its last counter wait (pid 1, cat "wait", the
// same tid and args.task) to its end. So a measured wave starts where a simulated one does, when
// its first work starts, not when the first SM began to wait for it. nullopt when a task names
// an op the plan no longer has (the first kernel's single-SM ops): such a trace keeps the
// timeline it was written with.
std::optional<std::vector<WorkSlice>> trace_work_slices(const nlohmann::json& events);

nlohmann::json wave_timings_json(const std::vector<WaveTiming>& waves);
std::vector<WaveTiming> wave_timings_from_json(const nlohmann::json& j);  // Error on a malformed entry
// The table bench decode prints: "one layer ...: X us" then one row per wave.
std::string format_layer_timeline(const LayerTimeline& t);


}  // namespace megadecode
