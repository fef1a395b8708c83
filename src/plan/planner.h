// The decode planner: a pure host function (ModelConfig, BatchState, Policy, PlanOptions) → Plan.
//
// Per layer it emits the waves QKV, ATTN, O_PROJ, ROUTER, EXPERT_UP, EXPERT_DOWN; then LM_HEAD and
// SAMPLE (op_table.h draws the graph). GEMM waves are cut into tiles sized to the SM count and dealt
// round-robin continuing where the previous wave ended; attention items (one task each) go largest
// first to the SM with the fewest attention bytes so far; EXPERT_UP and EXPERT_DOWN put share s on
// SM s. Lists are sorted by wave and every wait refers to producers of strictly earlier waves, which
// is what makes the plan deadlock-free (validator.h checks it).
//
// Dependencies: the QKV tiles of group g -> that group's attention items -> every O-proj tile
// (after all merges) -> every router tile -> the up shares -> the down shares -> the next layer.
#pragma once

#include <vector>

#include "model/config.h"
#include "plan/plan.h"
#include "plan/policy.h"

namespace megadecode {

// Error unless the planner (so cpu-mk and the megakernel) runs this model: qwen3_moe with MoE,
// full-attention RoPE layers. Backends call it before they touch the weights.
void check_model_plannable(const ModelConfig& config);

Plan make_plan(const ModelConfig& config, const BatchState& batch, const Policy& policy,
               const PlanOptions& options = {});

// How one sequence's context is cut into attention splits: a function of its own length only
// (never of the batch), so its merge order, and so its logits, do not depend on batch composition.
struct AttnSplit {
  int n_splits;
  int len;  // tokens per split (a multiple of the KV block size); the last split may be shorter
};
AttnSplit attn_split_for(int n_ctx, const Policy& policy, int kv_block_size);

// The attention split of one step (exposed for tests and statistics): items group-major, then by
// sequence and split.
std::vector<AttnItem> plan_attention_items(const ModelConfig& config, const BatchState& batch, const Policy& policy);

}  // namespace megadecode
