// Pieces of the planner shared between its files (not part of the plan/ interface): the layout
// (planner_layout.cpp), the skeleton of the static waves (planner.cpp) and the assembly of a plan
// from a skeleton and the step's attention items (planner_assemble.cpp), which make_plan and
// StepPlanner share.
#pragma once

#include <vector>

#include "plan/planner.h"

namespace megadecode {

void check_plannable(const ModelConfig& c, const BatchState& batch, const Policy& policy, const PlanOptions& opt);
void check_batch(const BatchState& batch);
// Each sequence's ring table covers its context in a ring of ring_len blocks (none when 0).
void check_ring_tables(const BatchState& batch, int ring_len);
PlanShape plan_shape(const ModelConfig& c, const BatchState& batch, const Policy& p, const PlanOptions& opt);
CounterLayout counter_layout(const PlanShape& s, int n_waves);
BufferLayout buffer_layout(const PlanShape& s);

// Everything of a plan that depends on the batch size alone (not on contexts or block tables):
// every wave but ATTN built and dealt to its SMs, the counter layout, the counters' kinds and the
// totals of the static tasks' arrivals. SM m's list is its static segments with each layer's
// attention tasks between them: segment k (k = 0..n_layers) of SM m is
// static_tasks[seg_begin[m * (n_layers + 1) + k], seg_begin[m * (n_layers + 1) + k + 1]).
struct PlanSkeleton {
  PlanShape shape{};  // max_blocks_per_seq and n_attn_items belong to the step
  CounterLayout counters{};
  std::vector<WaveInfo> waves;    // the ATTN waves with n_tasks 0
  std::vector<int> attn_wave;     // [n_layers] index of layer L's ATTN wave
  std::vector<int> attn_cursor;   // [n_layers] the round-robin cursor when that wave is dealt
  std::vector<Task> static_tasks;
  std::vector<int32_t> static_wave;  // [static_tasks]
  std::vector<int32_t> seg_begin;    // [n_sms * (n_layers + 1) + 1]
  std::vector<CounterInfo> counter_info;  // kinds; totals of the static arrivals only
  std::vector<uint8_t> attn_flags;        // [n_layers] the ATTN tasks' flags (kAttnSliding, kAttnNoRope)
  double up_balance_tokens_per_unit = 0;  // Policy's (parallel blocks; 0: equal up shares)
};
// `layers`: the model's layer specs (ATTN flags, dense or MoE FFN; parallel blocks only).
PlanSkeleton plan_skeleton(const PlanShape& s, const std::vector<LayerSpec>& layers, const Policy& policy);
// Items [0, count_full_items) of plan_attention_items serve the full layers, the rest the sliding ones.
int count_full_items(const ModelConfig& c, const BatchState& batch, const Policy& p);
// Layer L's ATTN task for item `item` of KV group `group`.
Task attention_task(const PlanSkeleton& sk, int layer, int item, int group);

// Where each attention item goes, relative to the wave's round-robin cursor: largest first, each
// to the SM with the fewest attention key positions so far, ties to the first SM after the cursor.
// Loads start at zero in every layer, so layer L's SM of item i is (rel[i] + cursor_L) % n_sms.
std::vector<int> place_attention(const std::vector<AttnItem>& items, int n_sms);
// The same for each set (items [0, n_full) and [n_full, size)) on its own, concatenated.
std::vector<int> place_attention_sets(const std::vector<AttnItem>& items, int n_full, int n_sms);

// Fills every field of `plan` but attn_items and params (tasks, lists, waves, counters, dynamic
// arrivals) from the skeleton and the step's items and their placement.
// Items [0, n_full_items) serve the full layers, the rest the sliding ones (parallel blocks only).
void assemble_plan(const PlanSkeleton& sk, const std::vector<AttnItem>& items, int n_full_items,
                   const std::vector<int>& rel_sm, Plan& plan);

}  // namespace megadecode
