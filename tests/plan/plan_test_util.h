// Helpers shared by the plan, emulator and CLI tests: random small qwen3_moe shapes (every size the
// planner accepts, awkward ones on purpose), random batches with ragged contexts and shuffled block
// tables, random policies; finding a plan's tasks; `megadecode plan` in-process.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/check.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/presets.h"
#include "plan/plan.h"
#include "plan/policy.h"
#include "plan/validator.h"

namespace megadecode::test {

inline int pick(SplitMix64& rng, std::initializer_list<int> values) {
  return *(values.begin() + rng.below(values.size()));
}

// A small random qwen3_moe shape. The planner needs the hidden size, the head dim and the MoE
// intermediate size in multiples of 16; the rest is awkward on purpose (expert counts and
// vocabularies that leave a partial last row block, one-row-block hidden sizes).
inline ModelConfig random_config(SplitMix64& rng) {
  ModelConfig c = preset_config("tiny");
  c.hidden_size = pick(rng, {16, 32, 48, 64, 80});
  c.n_kv_heads = pick(rng, {1, 2, 3});
  c.n_heads = c.n_kv_heads * pick(rng, {1, 2, 4});
  c.head_dim = pick(rng, {16, 32});
  c.n_experts = pick(rng, {4, 6, 8, 12, 20});
  c.n_experts_per_tok = 1 + static_cast<int>(rng.below(std::min(4, c.n_experts)));
  c.moe_intermediate_size = pick(rng, {16, 32, 48});
  c.vocab_size = 50 + static_cast<int>(rng.below(500));
  c.norm_topk_prob = rng.below(4) != 0;
  c.rope_theta = rng.below(2) ? 1e6 : 1e4;
  const int layers = 1 + static_cast<int>(rng.below(3));
  c.n_layers = layers;
  c.layers.assign(layers, LayerSpec{0, true, FfnKind::kMoe});
  c.max_position_embeddings = 1 << 16;
  return c;
}

// Several tiles of one op per SM at times, and short attention splits, so that small shapes still
// run every path of the plan.
inline Policy random_policy(SplitMix64& rng, const std::string& name) {
  Policy p = policy_by_name(name);
  p.tiles_per_sm = pick(rng, {1, 1, 2, 3, 8});
  p.attn_min_split_tokens = pick(rng, {1, 8, 16, 64});
  p.attn_max_splits = pick(rng, {1, 3, 8, 64});
  return p;
}

// Owns the block tables a BatchState points into. Blocks are a random permutation of the pool
// (shuffled tables); contexts are ragged in [1, max_ctx], some exactly at block boundaries.
struct RandomBatch {
  std::vector<std::vector<int32_t>> tables;
  BatchState state;
  int n_blocks = 0;
};

inline RandomBatch random_batch(SplitMix64& rng, int batch, int max_ctx, int block_size) {
  RandomBatch rb;
  rb.state.kv_block_size = block_size;
  std::vector<int> ctx(batch);
  for (int& n : ctx) {
    switch (rng.below(4)) {
      case 0: n = 1; break;
      case 1: n = std::max(1, std::min(max_ctx, block_size * (1 + static_cast<int>(rng.below(4))) + static_cast<int>(rng.below(3)) - 1)); break;
      default: n = 1 + static_cast<int>(rng.below(max_ctx)); break;
    }
  }
  int total = 0;
  for (int n : ctx) total += (n + block_size - 1) / block_size;
  rb.n_blocks = total + static_cast<int>(rng.below(8));
  std::vector<int32_t> pool(rb.n_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  for (int i = rb.n_blocks - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
  int next = 0;
  rb.tables.resize(batch);
  for (int i = 0; i < batch; ++i) {
    const int nb = (ctx[i] + block_size - 1) / block_size;
    rb.tables[i].assign(pool.begin() + next, pool.begin() + next + nb);
    next += nb;
  }
  for (int i = 0; i < batch; ++i) rb.state.seqs.push_back({ctx[i], rb.tables[i]});
  return rb;
}

// The tasks of `op` at `layer` (every SM, in task order); `sm` >= 0 keeps that SM's only.
inline std::vector<int> tasks_of(const Plan& plan, Op op, int layer, int sm = -1) {
  std::vector<int> out;
  const int begin = sm < 0 ? 0 : plan.list_begin[sm], end = sm < 0 ? plan.list_begin.back() : plan.list_begin[sm + 1];
  for (int i = begin; i < end; ++i)
    if (plan.tasks[i].op == static_cast<uint8_t>(op) && plan.tasks[i].layer == layer) out.push_back(i);
  return out;
}

// The nth task of `op` at `layer` on SM `sm` (-1: any SM); a test failure when there is none.
inline int find_task(const Plan& plan, Op op, int layer, int sm = -1, int nth = 0) {
  const std::vector<int> all = tasks_of(plan, op, layer, sm);
  if (nth < static_cast<int>(all.size())) return all[nth];
  ADD_FAILURE() << "no " << op_name(op) << " task #" << nth << " of L" << layer << " on SM " << sm;
  return -1;
}

// The first field in which two plans differ ("" when they are equal in every field, bit for bit).
inline std::string plan_difference(const Plan& a, const Plan& b) {
  auto bytes_equal = [](const auto& x, const auto& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  if (std::memcmp(&a.params, &b.params, sizeof a.params) != 0) return "params";
  if (a.policy != b.policy) return "policy";
  if (!bytes_equal(a.tasks, b.tasks)) {
    for (size_t i = 0; i < std::min(a.tasks.size(), b.tasks.size()); ++i)
      if (std::memcmp(&a.tasks[i], &b.tasks[i], sizeof(Task)) != 0) return "tasks (first at " + std::to_string(i) + ")";
    return "tasks (count " + std::to_string(a.tasks.size()) + " vs " + std::to_string(b.tasks.size()) + ")";
  }
  if (a.list_begin != b.list_begin) return "list_begin";
  if (a.task_wave != b.task_wave) return "task_wave";
  if (a.waves.size() != b.waves.size()) return "waves";
  for (size_t i = 0; i < a.waves.size(); ++i)
    if (a.waves[i].op != b.waves[i].op || a.waves[i].layer != b.waves[i].layer || a.waves[i].n_tasks != b.waves[i].n_tasks)
      return "wave " + std::to_string(i);
  if (!bytes_equal(a.attn_items, b.attn_items)) return "attn_items";
  if (a.counters.size() != b.counters.size()) return "counters";
  for (size_t i = 0; i < a.counters.size(); ++i) {
    const CounterInfo &x = a.counters[i], &y = b.counters[i];
    if (x.kind != y.kind || x.layer != y.layer || x.index != y.index || x.total != y.total)
      return "counter " + std::to_string(i);
  }
  if (a.dynamic_arrivals.size() != b.dynamic_arrivals.size()) return "dynamic_arrivals";
  for (size_t i = 0; i < a.dynamic_arrivals.size(); ++i) {
    const DynamicArrival &x = a.dynamic_arrivals[i], &y = b.dynamic_arrivals[i];
    if (x.counter != y.counter || x.max_amount != y.max_amount || x.tasks != y.tasks)
      return "dynamic arrival " + std::to_string(i);
  }
  return "";
}

// The validator's message for `plan` ("" when it accepts the plan).
inline std::string validation_error(const Plan& plan) {
  try {
    validate_plan(plan);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs `megadecode plan ARGS` and returns what it printed (errors propagate as exceptions).
inline std::string run_plan(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  try {
    EXPECT_EQ(cmd_plan(static_cast<int>(argv.size()), argv.data()), 0);
  } catch (...) {
    testing::internal::GetCapturedStdout();
    throw;
  }
  return testing::internal::GetCapturedStdout();
}

}  // namespace megadecode::test
