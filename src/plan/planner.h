// The decode planner: a pure host function (ModelConfig, BatchState, Policy, PlanOptions) → Plan.
//
// Per layer it emits the waves ATTN_NORM, QKV, ATTN (drain), O_PROJ, MOE_NORM, ROUTER, DISPATCH,
// EXPERT_UP (drain), EXPERT_DOWN (drain); then FINAL_NORM, LM_HEAD, SAMPLE. Static waves are dealt
// round-robin (task k of a wave on SM (start + k) mod S, start per policy); drain waves put one
// drain task on every SM. Lists are sorted by wave and every wait refers to producers of strictly
// earlier waves, which is what makes the plan deadlock-free (validator.h checks it).
//
// Dependencies are per tile: QKV tiles of group g → attention items of group g → O-proj tiles of
// group g (K split by group, partial sums reduced in fixed order by MOE_NORM). Everything that
// depends on the batch's lengths (attention items, split counts) is in attn_items and the
// attention counters' totals; the task lists themselves depend only on (config, batch size,
// policy, options), so an engine may cache them and rebuild only the items each step.
#pragma once

#include <vector>

#include "model/config.h"
#include "plan/plan.h"
#include "plan/policy.h"

namespace megadecode {

Plan make_plan(const ModelConfig& config, const BatchState& batch, const Policy& policy,
               const PlanOptions& options = {});

// How one sequence's context is cut into attention splits: a function of its own length only
// (never of the batch), so its merge order, and so its logits, do not depend on batch composition.
struct AttnSplit {
  int n_splits;
  int len;  // tokens per split (a multiple of the KV block size); the last split may be shorter
};
AttnSplit attn_split_for(int n_ctx, const Policy& policy, int kv_block_size);

// The attention split of one step (exposed for tests and statistics): items in queue order.
std::vector<AttnItem> plan_attention_items(const ModelConfig& config, const BatchState& batch, const Policy& policy);

// Rows per tile so a tile streams about `weight_bytes` of bf16 weights with rows of k elements:
// a multiple of `align`, at least `align` (or `dim` when smaller), at most `dim`.
int tile_rows(int64_t k, int64_t weight_bytes, int align, int dim);

}  // namespace megadecode
