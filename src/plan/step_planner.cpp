// StepPlanner: make_plan's result from a cached skeleton, patched per step (see step_planner.h).
#include "plan/step_planner.h"

#include <cstring>
#include <memory>
#include <utility>

#include "core/check.h"
#include "plan/planner_internal.h"

namespace megadecode {

StepPlanner::StepPlanner(const ModelConfig& config, const Policy& policy, const PlanOptions& options)
    : config_(config), policy_(policy), options_(options) {}

StepPlanner::~StepPlanner() = default;

// Whether every sequence keeps the split of the last plan (then its items differ in the end of
// their last split only).
bool StepPlanner::same_splits(const BatchState& batch) {
  bool same = splits_.size() == batch.seqs.size();
  splits_.resize(batch.seqs.size());
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const AttnSplit a = attn_split_for(batch.seqs[i].n_ctx, policy_, batch.kv_block_size);
    same = same && a.n_splits == splits_[i].n_splits && a.len == splits_[i].len;
    splits_[i] = a;
  }
  return same;
}

namespace {

// The fields assemble_plan writes.
bool same_lists(const Plan& a, const Plan& b) {
  return a.tasks.size() == b.tasks.size() &&
         std::memcmp(a.tasks.data(), b.tasks.data(), a.tasks.size() * sizeof(Task)) == 0 &&
         a.list_begin == b.list_begin && a.task_wave == b.task_wave && a.waves == b.waves && a.counters == b.counters &&
         a.dynamic_arrivals == b.dynamic_arrivals;
}

void swap_lists(Plan& a, Plan& b) {
  std::swap(a.tasks, b.tasks);
  std::swap(a.list_begin, b.list_begin);
  std::swap(a.task_wave, b.task_wave);
  std::swap(a.waves, b.waves);
  std::swap(a.counters, b.counters);
  std::swap(a.dynamic_arrivals, b.dynamic_arrivals);
}

}  // namespace

// Items are group-major, then by sequence and split (plan_attention_items): the item of sequence
// i's last split in group g ends at the new context; no other item moves.
void StepPlanner::patch_items(const BatchState& batch) {
  std::vector<AttnItem>& items = plan_.attn_items;
  size_t at = 0;
  for (int g = 0; g < config_.n_kv_heads; ++g)
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      at += splits_[i].n_splits;
      items[at - 1].pos_end = batch.seqs[i].n_ctx;
    }
  MD_CHECK(at == items.size());
}

const Plan& StepPlanner::plan(const BatchState& batch) {
  check_plannable(config_, batch, policy_, options_);
  check_batch(batch);
  PlanShape s = plan_shape(config_, batch, policy_, options_);
  check_ring_tables(batch, s.ring_len);
  s.n_full_items = s.parallel ? count_full_items(config_, batch, policy_) : 0;
  update_ = PlanUpdate{};
  if (!skeleton_ || skeleton_->shape.batch != s.batch || skeleton_->shape.kv_block_size != s.kv_block_size) {
    skeleton_ = std::make_unique<PlanSkeleton>(plan_skeleton(s, config_.layers, policy_));
    plan_ = Plan{};
    plan_.policy = policy_.name;
    splits_.clear();
    update_.new_skeleton = true;
    ++counts_.new_skeletons;
  }
  // Sliding layers' items move with the window every step: those plans redo their items.
  const bool same = same_splits(batch) && !update_.new_skeleton && s.sliding_window == 0;
  if (same)
    patch_items(batch);
  else
    plan_.attn_items = plan_attention_items(config_, batch, policy_);
  std::vector<int> rel = place_attention_sets(plan_.attn_items, s.n_full_items, s.n_sms);
  if (!same || rel != rel_sm_) {
    // Assembled aside and compared: a sliding-window model redoes its items every step (the window
    // moves), and its lists mostly come out as they were (the up shares' balance moves in steps).
    const bool aside = !update_.new_skeleton;
    assemble_plan(*skeleton_, plan_.attn_items, s.n_full_items, rel, aside ? scratch_ : plan_);
    rel_sm_ = std::move(rel);
    if (aside && same_lists(scratch_, plan_)) {
      ++counts_.patched;
    } else {
      if (aside) swap_lists(scratch_, plan_);
      update_.lists_changed = true;
      if (!update_.new_skeleton) ++counts_.reassembled;
    }
  } else {
    ++counts_.patched;
  }
  if (update_.lists_changed) ++lists_version_;
  s.n_attn_items = static_cast<int32_t>(plan_.attn_items.size());
  plan_.params.shape = s;
  plan_.params.counters = skeleton_->counters;
  plan_.params.buffers = buffer_layout(s);
  return plan_;
}

}  // namespace megadecode
