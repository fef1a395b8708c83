// Plans decode steps the way make_plan does, bit for bit, at the cost of what changed:
// what depends on the batch size alone (every wave but ATTN, dealt; counters; the skeleton) is
// built once per batch size; per step only the attention items, their placement and the
// shape's per-step fields are redone, and the task lists are rewritten only when the placement of
// the attention items changed. The host-side class a backend holds per decode path: cuda-mk and the
// null backend (bench engine) call plan() where they called make_plan().
//
//   same batch size, same split of every sequence, same placement: patch the items' ends
//       (one per sequence and KV group), max_blocks_per_seq and the buffer layout — O(batch);
//   the placement changed (a sequence's split geometry changed, or its last split's length
//       reordered the items), or the model has sliding-window layers (their items move with the
//       window every step): the lists are reassembled from the skeleton (no wave is rebuilt) aside,
//       and announced (lists_changed) only when they differ from the last ones;
//   another batch size (or KV block size): a new skeleton.
// Threading: one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/policy.h"

namespace megadecode {

struct PlanSkeleton;

// What the last StepPlanner::plan() rewrote. attn_items and params are rewritten every step.
struct PlanUpdate {
  bool new_skeleton = false;   // built for a new batch size: everything changed
  bool lists_changed = false;  // tasks, list_begin, task_wave, waves, counters, dynamic arrivals
};

class StepPlanner {
 public:
  StepPlanner(const ModelConfig& config, const Policy& policy, const PlanOptions& options);
  ~StepPlanner();
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  // The plan of `batch`, equal in every field to make_plan(config, batch, policy, options). Valid
  // until the next call.
  const Plan& plan(const BatchState& batch);
  const PlanUpdate& last_update() const { return update_; }
  // Changes exactly when the lists do (lists_changed): a caller that keeps a copy of them, or a
  // device upload, compares it with the version it holds. 0 before the first plan.
  uint64_t lists_version() const { return lists_version_; }

  // Steps planned by each path (benchmarks report them).
  struct Counts {
    uint64_t patched = 0;      // lists kept
    uint64_t reassembled = 0;  // lists rewritten from the skeleton
    uint64_t new_skeletons = 0;
  };
  const Counts& counts() const { return counts_; }

 private:
  bool same_splits(const BatchState& batch);
  void patch_items(const BatchState& batch);

  ModelConfig config_;
  Policy policy_;
  PlanOptions options_;
  std::unique_ptr<PlanSkeleton> skeleton_;
  Plan plan_;
  Plan scratch_;  // lists assembled aside, kept when they differ from plan_'s (their buffers reused)
  std::vector<AttnSplit> splits_;  // [batch] each sequence's split in plan_
  std::vector<int> rel_sm_;        // [attn items] their placement in plan_ (place_attention)
  PlanUpdate update_;
  uint64_t lists_version_ = 0;
  Counts counts_;
};

}  // namespace megadecode
