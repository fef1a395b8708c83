// Serving metrics the engine records and /metrics exports (names follow vLLM's `vllm:` metrics
// with a `megadecode:` prefix; rendering is in server/metrics_text.cpp).
// Threading: every member may be updated and read from any thread (atomics; histograms lock).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "engine/step_times.h"

namespace megadecode {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // [upper_bounds.size() + 1], last is +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1] per bucket (not cumulative)
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct EngineMetrics {
  EngineMetrics();
  // Gauges (the scheduler publishes them after every change: a request added or aborted, a step,
  // an idle step, a shutdown), so they fall back to 0 when the last request ends, however it ends.
  std::atomic<int> n_running{0};
  std::atomic<int> n_waiting{0};
  // KV blocks per layer type: the full-attention layers' pool (kv_blocks_*) and the sliding-window
  // layers' ring pool (kv_ring_blocks_*, 0 for a model without sliding layers).
  std::atomic<int> kv_blocks_used{0};
  std::atomic<int> kv_blocks_total{0};
  std::atomic<int> kv_ring_blocks_used{0};
  std::atomic<int> kv_ring_blocks_total{0};
  // Counters.
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> generation_tokens{0};
  std::atomic<uint64_t> preemptions{0};
  std::atomic<uint64_t> prefix_cache_queries{0};  // prompt tokens looked up
  std::atomic<uint64_t> prefix_cache_hits{0};     // of those, served from the cache
  std::array<std::atomic<uint64_t>, 4> finished{};  // indexed by FinishReason
  std::atomic<uint64_t> rejected_queue_full{0};
  // Histograms, seconds; token counts.
  Histogram time_to_first_token;
  Histogram inter_token_latency;
  Histogram e2e_request_latency;
  Histogram request_queue_time;    // arrival to the first step that computes its tokens
  Histogram request_prefill_time;  // that step to the first generated token
  Histogram request_prompt_tokens;
  Histogram request_generation_tokens;
  // Per scheduler iteration that launched or processed a decode step (StepTimes), seconds: the
  // host's phases, their sum, and the wait for the device.
  Histogram step_schedule;
  Histogram step_plan;
  Histogram step_stage;
  Histogram step_launch;
  Histogram step_output;
  Histogram step_host;
  Histogram step_wait;
  void record_step(const StepTimes& t);
};

}  // namespace megadecode
