// CudaProbe: the one door of the benchmarks and tests into a CUDA backend's steps (CudaBackend::
// probe()): replaying and timing the last step, per-kernel profiles, the megakernel's trace,
// counters and arena, and the test-only faults (NaN-poisoned activations, a stuck wait). Nothing
// the engine or the server calls.
// Threading: the backend's (one caller at a time).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/megakernel/trace.h"
#include "engine/backend.h"
#include "plan/plan.h"

namespace megadecode::cuda {

class CudaBackend;
class MegakernelStep;

class CudaProbe {
 public:
  explicit CudaProbe(CudaBackend& backend) : be_(backend) {}

  // Replays the last decode step `warmup` + `reps` times as a CUDA graph (cuda-ops: its per-wave
  // graph; cuda-mk: the counter/error memsets and the one launch, captured once; the batched
  // path: its step graph) and returns the milliseconds of each timed replay (CUDA events around
  // the graph launch). The step is idempotent (same inputs, same KV slot written), so replays do
  // the same work; the device error word is checked after every replay.
  std::vector<float> time_last_step(int warmup, int reps);
  // The batched path's last step once more with an event after every launch: milliseconds per
  // kernel, summed over the layers (empty when the last step ran on the megakernel).
  std::vector<std::pair<std::string, double>> profile_last_step();
  // The next prefill() with an event after every launch: milliseconds per kernel of all its pieces,
  // summed over the layers. Error when the backend prefills without the prefill runner.
  std::vector<std::pair<std::string, double>> profile_prefill(const SeqChunk& chunk);

  // ---- the megakernel's (Error on cuda-batched) ----
  // Per-SM trace of the following launches (trace.h): capacity records per SM and role; 0 turns
  // it off. Either way a decode() must follow before time_last_step. read_trace() returns every
  // SM's records of the last launch (the last graph replay for cuda-ops: all its waves) and the
  // number dropped for lack of capacity.
  void enable_trace(int capacity_per_sm);
  std::vector<TraceRecord> read_trace(int64_t* dropped = nullptr) const;
  // The plan of the last megakernel step, and the counters that differ from its exact totals after
  // the step ("" when none).
  const Plan& last_plan() const;
  std::string check_counter_totals() const;

  // ---- test-only faults ----
  // Fills every activation buffer of the step with NaN before the launch (both paths).
  void set_poison_activations(bool on);
  // Adds 1 to the first wait target of plan task `task` in the next steps (-1: off), so that wait
  // can never be satisfied (the watchdog ends the step).
  void set_stuck_task(int task);

 private:
  MegakernelStep& megakernel() const;  // Error when the backend has none
  CudaBackend& be_;
};

}  // namespace megadecode::cuda
