// Statistics of a plan for `megadecode plan` and the benchmark: tasks and weight bytes per op and
// per SM, counters, attention items, and the critical path in tasks (longest chain of dependent tasks,
// with and without the order each SM's list imposes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/plan.h"

namespace megadecode {

struct OpStats {
  Op op;
  int64_t tasks = 0;           // task records
  int64_t items = 0;           // attention items; MoE units (worst case, every routable expert active)
  int64_t bytes_per_item = 0;  // bf16 weight (or KV) bytes one task streams, the largest (MoE: a share)
  int64_t total_bytes = 0;     // over the step (MoE: at the worst case, every expert active)
};

struct PlanStats {
  std::string policy;
  int n_sms = 0;
  int batch = 0;
  int n_layers = 0;
  int64_t n_tasks = 0;
  int n_waves = 0;
  std::vector<OpStats> ops;  // one per op present
  int64_t tasks_per_sm_min = 0, tasks_per_sm_max = 0;
  double tasks_per_sm_mean = 0;
  int64_t static_bytes_per_sm_min = 0, static_bytes_per_sm_max = 0;  // weights of static tasks
  double static_bytes_per_sm_mean = 0;
  int32_t n_counters = 0;
  int64_t counter_bytes = 0;
  int attn_items = 0;
  int attn_max_splits = 0;  // most splits of one sequence this step
  int64_t arena_bytes = 0;
  int critical_path_tasks = 0;          // dependencies only
  int critical_path_tasks_ordered = 0;  // dependencies and list order
  int64_t task_bytes = 0;               // task records uploaded
  // K and V bytes (bf16) the step's attention reads, every layer: as planned (sliding layers read
  // their window), and as full attention on every layer would; sliding_window 0: no sliding layer.
  int64_t kv_bytes_read = 0;
  int64_t kv_bytes_full_attention = 0;
  int sliding_window = 0;
};

PlanStats plan_stats(const Plan& plan);
std::string format_plan_stats(const PlanStats& stats);
nlohmann::json plan_stats_json(const PlanStats& stats);

}  // namespace megadecode
