// Histogram and the metric set's bucket layouts (vLLM's bucket choices where they exist).
#include "engine/metrics.h"

#include <algorithm>
#include <cmath>

namespace megadecode {

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot s;
  s.upper_bounds = bounds_;
  s.cumulative.resize(counts_.size());
  uint64_t run = 0;
  for (size_t i = 0; i < counts_.size(); ++i) s.cumulative[i] = run += counts_[i];
  s.sum = sum_;
  s.count = count_;
  return s;
}

namespace {
std::vector<double> token_buckets() {
  std::vector<double> b;
  for (double x = 1; x <= 1e6; x *= 10) {
    b.push_back(x);
    b.push_back(2 * x);
    b.push_back(5 * x);
  }
  return b;
}

// 1 us to 10 s in 1-2.5-5 steps: host phases take microseconds, device waits milliseconds.
std::vector<double> step_buckets() {
  std::vector<double> b;
  for (int e = -6; e < 1; ++e)
    for (double m : {1.0, 2.5, 5.0}) b.push_back(m * std::pow(10.0, e));
  b.push_back(10.0);
  return b;
}
}  // namespace

EngineMetrics::EngineMetrics()
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      inter_token_latency({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0}),
      e2e_request_latency({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0}),
      request_queue_time({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                          240.0, 480.0, 960.0, 1920.0, 7680.0}),
      request_prefill_time({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                            60.0, 120.0}),
      request_prompt_tokens(token_buckets()),
      request_generation_tokens(token_buckets()),
      step_schedule(step_buckets()),
      step_plan(step_buckets()),
      step_stage(step_buckets()),
      step_launch(step_buckets()),
      step_output(step_buckets()),
      step_host(step_buckets()),
      step_wait(step_buckets()) {
  for (auto& f : finished) f = 0;
}

void EngineMetrics::record_step(const StepTimes& t) {
  step_schedule.observe(t.schedule_s);
  step_plan.observe(t.plan_s);
  step_stage.observe(t.stage_s);
  step_launch.observe(t.launch_s);
  step_output.observe(t.output_s);
  step_host.observe(t.host_s());
  step_wait.observe(t.wait_s);
}

}  // namespace megadecode
