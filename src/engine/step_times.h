// Where one scheduler iteration's time went: the host's phases (scheduling, the backend's plan,
// staging and launch, output processing) and the wait for the device. An iteration launches at
// most one decode step and processes at most one step's tokens (with overlap, the previous
// step's), so in steady decoding an iteration is a step. Exported as Prometheus histograms
// (EngineMetrics::record_step) and printed by `serve --log-steps` (step_line).
#pragma once

#include <cstdint>
#include <string>

namespace megadecode {

struct StepTimes {
  uint64_t step = 0;     // iteration number, from 1
  int batch = 0;         // rows launched this iteration (0: none)
  int n_processed = 0;   // rows whose tokens were processed this iteration (discarded ones excluded)
  bool chained = false;  // launched before the previous step's tokens were processed (overlap)
  int mixed_tokens = 0;  // prompt tokens that rode in this iteration's decode step (a mixed step)
  // Host phases, seconds.
  double schedule_s = 0.0;  // admission, block tables, building the batch, bookkeeping
  double plan_s = 0.0;      // the backend's plan (DecodeTimes)
  double stage_s = 0.0;     // the backend's staging and uploads (DecodeTimes)
  double launch_s = 0.0;    // the rest of decode_async(): the launch itself
  double output_s = 0.0;    // output processing: end tokens, detokenizer, stop strings, sinks
  // Not host overhead: the device's share (or a CPU backend's compute) and prompt chunks.
  double wait_s = 0.0;     // blocked in collect(): device time the host work did not hide
  double compute_s = 0.0;  // a CPU backend's step, run inside decode_async() (DecodeTimes)
  double prefill_s = 0.0;  // Backend::prefill calls

  double host_s() const { return schedule_s + plan_s + stage_s + launch_s + output_s; }
};

// One line: "step 12 batch 8 chained + 16 prompt | host 41.2 us = schedule 5.1 plan 20.3 stage 3.2 launch 0.4
// output 12.2 | wait 3990.1 us compute 0.0 us prefill 0.0 us" ("+ N prompt": a mixed step's prompt tokens).
std::string step_line(const StepTimes& t);

}  // namespace megadecode
