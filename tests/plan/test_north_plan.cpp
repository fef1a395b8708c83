// The decode plan of cohere2_moe: parallel blocks (QKV and router read the layer input,
// routing and the experts wait on the router only, never on the layer's attention or O-proj;
// O-proj waits on both and writes the residual; the next layer funnels on O-proj), sliding layers'
// attention items over the last W positions (flag kAttnSliding), NoPE full layers (kAttnNoRope),
// the dense first layer as DENSE_UP/DENSE_DOWN shares; the router-after-attn ablation; random
// plans validate, the validator rejects each broken rule with a message naming it; StepPlanner
// equals make_plan over evolving batches; the full north-mini-code shape reads 0.357 of full
// attention's KV at 32K (13 full and 36 sliding layers) and `plan --simulate` runs on it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>

#include "core/check.h"
#include "kv/kv_cache.h"
#include "plan/planner.h"
#include "plan/simulate.h"
#include "plan/stats.h"
#include "plan/step_planner.h"
#include "plan/validator.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

using test::validation_error;

ModelConfig with_window(ModelConfig c, int window) {
  for (LayerSpec& l : c.layers)
    if (l.sliding_window > 0) l.sliding_window = window;
  return c;
}

// Block and ring tables for contexts `ctx` (distinct blocks of each pool).
struct NorthBatch {
  std::vector<std::vector<int32_t>> tables, rings;
  BatchState state;
};

NorthBatch north_batch(const ModelConfig& c, const std::vector<int>& ctx, int block_size) {
  NorthBatch b;
  b.state.kv_block_size = block_size;
  const int r = kv_ring_length(c.max_sliding_window(), block_size);
  int32_t next = 0, next_ring = 0;
  for (int n : ctx) {
    std::vector<int32_t> t((n + block_size - 1) / block_size), ring(std::min<size_t>(r, t.size()));
    for (int32_t& x : t) x = next++;
    for (int32_t& x : ring) x = next_ring++;
    b.tables.push_back(std::move(t));
    b.rings.push_back(std::move(ring));
  }
  for (size_t i = 0; i < ctx.size(); ++i) b.state.seqs.push_back({ctx[i], b.tables[i], b.rings[i]});
  return b;
}

void expect_error(const Plan& plan, const std::string& what) {
  const std::string e = validation_error(plan);
  if (std::getenv("SHOW_ERRORS")) std::printf("%s\n", e.c_str());
  EXPECT_NE(e.find(what), std::string::npos) << "error: " << e;
}

bool waits_on(const Task& t, int32_t counter) {
  for (int j = 0; j < t.n_waits; ++j)
    if (t.wait[j].counter == counter) return true;
  return false;
}

// What the planner promises for a parallel plan, checked on the records themselves.
void check_parallel_structure(const ModelConfig& c, const Plan& plan, const std::vector<int>& ctx, bool router_after_attn) {
  const PlanShape& s = plan.params.shape;
  const CounterLayout& k = plan.params.counters;
  ASSERT_EQ(s.parallel, 1);
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    if (t.layer < 0) continue;
    const int L = t.layer;
    const LayerSpec& spec = c.layers[L];
    const Op op = static_cast<Op>(t.op);
    const std::string where = describe_task(plan, static_cast<int>(i));
    auto C = [&](int32_t off) { return layer_counter(k, L, off); };
    if (op == Op::kAttn) {
      EXPECT_EQ(t.flags, (spec.sliding_window ? kAttnSliding : 0) | (spec.use_rope ? 0 : kAttnNoRope)) << where;
      const AttnItem& it = plan.attn_items[t.arg[0]];
      if (spec.sliding_window) {
        EXPECT_GE(t.arg[0], s.n_full_items) << where;
        EXPECT_GE(it.pos_begin, ctx[it.seq] - spec.sliding_window) << where;
      } else {
        EXPECT_LT(t.arg[0], s.n_full_items) << where;
      }
    } else if (op == Op::kExpertDown && plan.policy != "grid-sync") {
      // The O-proj wait, last, met at the combine.
      EXPECT_EQ(t.flags, kLastWaitAtWrite) << where;
      ASSERT_GE(t.n_waits, 2) << where;
      EXPECT_EQ(t.wait[t.n_waits - 1].counter, C(k.oproj_done)) << where;
    } else {
      EXPECT_EQ(t.flags, 0) << where;
    }
    if (plan.policy == "grid-sync") continue;
    EXPECT_TRUE(spec.ffn == FfnKind::kDense ? op != Op::kRouter && op != Op::kExpertUp && op != Op::kExpertDown
                                            : op != Op::kDenseUp && op != Op::kDenseDown)
        << where;
    const bool ffn = op == Op::kRouter || op == Op::kExpertUp || op == Op::kDenseUp;
    const bool down = op == Op::kExpertDown || op == Op::kDenseDown;
    if (ffn || down) {
      EXPECT_EQ(waits_on(t, C(k.attn_done)), router_after_attn && op == Op::kRouter) << where;
    }
    if (ffn) {
      EXPECT_FALSE(waits_on(t, C(k.oproj_done))) << where;
    }
    // The down shares write x = (x + o) + F: after every up share and every O-proj tile.
    if (down) {
      EXPECT_TRUE(waits_on(t, C(k.oproj_done)) && waits_on(t, C(k.up_done))) << where;
    }
    // The next layer's input is the down shares' x.
    if ((op == Op::kRouter || op == Op::kDenseUp || op == Op::kExpertUp || op == Op::kQkv) && L > 0) {
      EXPECT_TRUE(waits_on(t, layer_counter(k, L - 1, k.down_done))) << where;
      EXPECT_FALSE(waits_on(t, layer_counter(k, L - 1, k.oproj_done))) << where;
    }
    // O-proj stores o beside the FFN: it waits on its layer's attention alone.
    if (op == Op::kOProj) {
      EXPECT_TRUE(waits_on(t, C(k.attn_done))) << where;
      EXPECT_FALSE(waits_on(t, C(k.down_done)) || waits_on(t, C(k.up_done))) << where;
    }
  }
}

TEST(NorthPlan, RandomPlansValidateWithTheParallelBlockRules) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 60; ++round) {
    const ModelConfig c = with_window(preset_config("north-tiny"), test::pick(rng, {3, 8, 13, 24, 40}));
    const std::string name = policy_names()[rng.below(policy_names().size())];
    const Policy p = test::random_policy(rng, name);
    const int bs = test::pick(rng, {1, 4, 16});
    std::vector<int> ctx(1 + rng.below(6));
    for (int& n : ctx) n = 1 + static_cast<int>(rng.below(300));
    const NorthBatch b = north_batch(c, ctx, bs);
    PlanOptions o;
    o.n_sms = 1 + static_cast<int>(rng.below(20));
    SCOPED_TRACE(cat("round ", round, " policy ", name, " window ", c.max_sliding_window(), " sms ", o.n_sms));
    const Plan plan = make_plan(c, b.state, p, o);
    ASSERT_NO_THROW(validate_plan(plan)) << validation_error(plan);
    // Sliding items: [max(0, ctx - W), ctx) per (seq, group), in splits.
    const PlanShape& s = plan.params.shape;
    ASSERT_EQ(s.sliding_window, c.max_sliding_window());
    ASSERT_EQ(s.ring_len, kv_ring_length(s.sliding_window, bs));
    std::vector<int> covered(ctx.size() * s.n_kv_heads, 0);
    for (int i = s.n_full_items; i < s.n_attn_items; ++i) {
      const AttnItem& it = plan.attn_items[i];
      ASSERT_GE(it.pos_begin, std::max(0, ctx[it.seq] - s.sliding_window));
      ASSERT_LE(it.pos_end, ctx[it.seq]);
      covered[it.seq * s.n_kv_heads + it.group] += it.pos_end - it.pos_begin;
    }
    for (size_t q = 0; q < covered.size(); ++q)
      ASSERT_EQ(covered[q], std::min(ctx[q / s.n_kv_heads], s.sliding_window)) << "pair " << q;
    check_parallel_structure(c, plan, ctx, p.router_after_attn);
  }
}

// One valid plan, then one broken rule at a time.
struct Broken {
  ModelConfig c = with_window(preset_config("north-tiny"), 8);
  NorthBatch b = north_batch(c, {30, 5, 17}, 4);
  Plan plan;
  explicit Broken(const std::string& policy = "default") {
    Policy p = policy_by_name(policy);
    p.tiles_per_sm = 2;
    p.attn_min_split_tokens = 4;
    plan = make_plan(c, b.state, p, PlanOptions{.n_sms = 5});
    validate_plan(plan);
  }
  int task(Op op, int layer, int nth = 0) { return test::find_task(plan, op, layer, -1, nth); }
};

TEST(NorthPlan, TheValidatorRejectsEachBrokenParallelRule) {
  {  // an up share that waits on its layer's attention: the overlap is gone
    Broken f;
    Task& t = f.plan.tasks[f.task(Op::kExpertUp, 2)];
    ASSERT_LT(t.n_waits, kMaxWaits);
    t.wait[t.n_waits++] = {layer_counter(f.plan.params.counters, 2, f.plan.params.counters.attn_done), 1};
    expect_error(f.plan, "the FFN must not wait on its layer's attention");
  }
  {  // the same wait is what router-after-attn plans have on purpose (on the router) and is valid there
    Broken f("router-after-attn");
    EXPECT_EQ(validation_error(f.plan), "");
    EXPECT_TRUE(waits_on(f.plan.tasks[f.task(Op::kRouter, 2)],
                         layer_counter(f.plan.params.counters, 2, f.plan.params.counters.attn_done)));
  }
  {  // a down share that does not wait for the O-proj tiles would add an unfinished o
    Broken f;
    Task& t = f.plan.tasks[f.task(Op::kExpertDown, 3)];
    ASSERT_EQ(t.n_waits, 2);
    t.n_waits = 1;  // up_done only
    t.flags = 0;
    expect_error(f.plan, "writes x = x + o + F but does not wait (directly or through other tasks) on");
  }
  {  // a down share whose one wait were kept for its write would fill from unfinished up shares
    Broken f;
    Task& t = f.plan.tasks[f.task(Op::kExpertDown, 3)];
    ASSERT_EQ(t.flags, kLastWaitAtWrite);
    t.wait[0] = t.wait[1];
    t.n_waits = 1;
    expect_error(f.plan, "kLastWaitAtWrite on a task with fewer than two waits");
  }
  {  // the flag on another op
    Broken f;
    f.plan.tasks[f.task(Op::kExpertUp, 3)].flags = kLastWaitAtWrite;
    expect_error(f.plan, "on a task that takes none");
  }
  {  // an O-proj tile that does not wait for the attention would read an unfinished output
    Broken f;
    Task& t = f.plan.tasks[f.task(Op::kOProj, 3)];
    ASSERT_EQ(t.n_waits, 1);
    t.n_waits = 0;
    expect_error(f.plan, "reads the attention output but does not wait");
  }
  {  // an O-proj tile that waits for the down shares: a cycle (they wait for it)
    Broken f;
    Task& t = f.plan.tasks[f.task(Op::kOProj, 3)];
    t.wait[t.n_waits++] = {layer_counter(f.plan.params.counters, 3, f.plan.params.counters.down_done),
                           f.plan.params.shape.n_sms};
    expect_error(f.plan, "dependency cycle");
  }
  {  // a sliding layer's task naming a full-layer item
    Broken f;
    const int i = f.task(Op::kAttn, 1);
    f.plan.tasks[i].flags = 0;
    expect_error(f.plan, "a full layer's task names item");
  }
  {  // a sliding item reaching one key before the window
    Broken f;
    const int n_full = f.plan.params.shape.n_full_items;
    f.plan.attn_items[n_full].pos_begin -= 1;
    expect_error(f.plan, "sliding-layer items cover");
  }
  {  // a full item starting past 0
    Broken f;
    f.plan.attn_items[0].pos_begin += 1;
    expect_error(f.plan, "of a full layer starts at position 1");
  }
  {  // a NoPE flag on a plan of sequential blocks
    std::vector<std::vector<int32_t>> tables{{0, 1}};
    BatchState b{16, {{20, tables[0]}}};
    Plan q = make_plan(preset_config("tiny"), b, policy_by_name("default"), PlanOptions{.n_sms = 3});
    q.tasks[test::find_task(q, Op::kAttn, 0)].flags = kAttnNoRope;
    expect_error(q, "on a task that takes none");
  }
  {  // a dense share in a MoE layer
    Broken f;
    f.plan.tasks[f.task(Op::kExpertDown, 2)].op = static_cast<uint8_t>(Op::kDenseDown);
    EXPECT_NE(validation_error(f.plan), "");
  }
}

// Shared experts: plan ops inside the expert shares. The shape carries their width and combination,
// the arena their activations; random plans with them validate; the validator rejects a down share
// that stops waiting on the up shares (it reads the shared MLP's activations too) and a shape whose
// shared experts do not fit; plan_stats and the timing model count their weights.
TEST(NorthPlan, SharedExpertsRideInTheExpertShares) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 30; ++round) {
    ModelConfig c = with_window(preset_config("north-tiny"), test::pick(rng, {3, 8, 24}));
    c.shared_intermediate_size = c.moe_intermediate_size * (1 + static_cast<int>(rng.below(3)));
    c.shared_combine = rng.below(2) ? SharedCombine::kSum : SharedCombine::kAverage;
    const std::string name = policy_names()[rng.below(policy_names().size())];
    std::vector<int> ctx(1 + rng.below(6));
    for (int& n : ctx) n = 1 + static_cast<int>(rng.below(100));
    const NorthBatch b = north_batch(c, ctx, 4);
    SCOPED_TRACE(cat("round ", round, " policy ", name));
    const Plan plan = make_plan(c, b.state, test::random_policy(rng, name), PlanOptions{.n_sms = 1 + static_cast<int>(rng.below(20))});
    ASSERT_NO_THROW(validate_plan(plan)) << validation_error(plan);
    const PlanShape& s = plan.params.shape;
    EXPECT_EQ(s.shared_inter, c.shared_intermediate_size);
    EXPECT_EQ(s.shared_units, c.shared_intermediate_size / 8);
    EXPECT_EQ(s.shared_average, c.shared_combine == SharedCombine::kAverage ? 1 : 0);
    EXPECT_GE(plan.params.buffers.shared_act.bytes, static_cast<uint64_t>(ctx.size()) * c.shared_intermediate_size * 4);
    check_parallel_structure(c, plan, ctx, name == "router-after-attn");
  }
  Broken f;
  f.c.shared_intermediate_size = 2 * f.c.moe_intermediate_size;
  f.c.shared_combine = SharedCombine::kAverage;
  Policy p = policy_by_name("default");
  p.tiles_per_sm = 2;
  p.attn_min_split_tokens = 4;
  const Plan good = make_plan(f.c, f.b.state, p, PlanOptions{.n_sms = 5});
  ASSERT_EQ(validation_error(good), "");
  {  // a down share that no longer waits for the up shares
    Plan q = good;
    Task& t = q.tasks[test::find_task(q, Op::kExpertDown, 2)];
    t.n_waits = 0;
    t.flags = 0;
    expect_error(q, "whose activations it reads");
  }
  {  // no room for the shared MLP's activations
    Plan q = good;
    q.params.buffers.shared_act.bytes -= 4;
    expect_error(q, "shared_act holds");
  }
  {  // averaging with no shared experts
    Plan q = good;
    q.params.shape.shared_inter = 0;
    q.params.shape.shared_units = 0;
    expect_error(q, "plan: shared experts of width 0");
  }
  // Their weights in the statistics and the timing model: every MoE share streams more.
  const Plan plain = make_plan(with_window(preset_config("north-tiny"), 8), f.b.state, p, PlanOptions{.n_sms = 5});
  const PlanStats with = plan_stats(good), without = plan_stats(plain);
  auto op_bytes = [](const PlanStats& st, Op op) {
    for (const OpStats& o : st.ops)
      if (o.op == op) return o.total_bytes;
    return int64_t{0};
  };
  const PlanShape& s = good.params.shape;
  EXPECT_EQ(op_bytes(with, Op::kExpertUp) - op_bytes(without, Op::kExpertUp),
            int64_t{s.shared_units} * 16 * s.hidden * 2 * s.n_layers);
  EXPECT_EQ(op_bytes(with, Op::kExpertDown) - op_bytes(without, Op::kExpertDown),
            int64_t{s.down_rbs} * 16 * s.shared_inter * 2 * s.n_layers);
  EXPECT_GT(simulate_plan(good, v3_h200_params()).step_us, simulate_plan(plain, v3_h200_params()).step_us);
}

TEST(NorthPlan, StepPlannerEqualsMakePlan) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = with_window(preset_config("north-tiny"), 12);
  for (const char* name : {"default", "grid-sync", "router-after-attn"}) {
    Policy p = policy_by_name(name);
    p.attn_min_split_tokens = 8;
    const PlanOptions o{.n_sms = 7};
    StepPlanner planner(c, p, o);
    std::vector<int> ctx{1, 30, 7};
    for (int step = 0; step < 40; ++step) {
      const NorthBatch b = north_batch(c, ctx, 4);
      const Plan& patched = planner.plan(b.state);
      const Plan fresh = make_plan(c, b.state, p, o);
      ASSERT_EQ(test::plan_difference(patched, fresh), "") << name << " step " << step;
      for (int& n : ctx) n += 1 + static_cast<int>(rng.below(3));
    }
  }
}

TEST(NorthPlan, BadRingTablesAreErrors) {
  const ModelConfig c = with_window(preset_config("north-tiny"), 8);
  NorthBatch b = north_batch(c, {30}, 4);
  b.state.seqs[0].ring_table = {};
  EXPECT_THROW(make_plan(c, b.state, policy_by_name("default"), PlanOptions{.n_sms = 2}), Error);
  NorthBatch q = north_batch(c, {30}, 4);
  q.rings[0][1] = -3;
  EXPECT_THROW(make_plan(c, q.state, policy_by_name("default"), PlanOptions{.n_sms = 2}), Error);
  NorthBatch two = north_batch(c, {30, 10}, 4);  // the second ring shares the first's block of position 29
  two.rings[1][2] = two.rings[0][(29 / 4) % kv_ring_length(8, 4)];
  try {
    make_plan(c, two.state, policy_by_name("default"), PlanOptions{.n_sms = 2});
    ADD_FAILURE() << "two sequences' new tokens in one ring slot accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ring slot"), std::string::npos) << e.what();
  }
  std::vector<std::vector<int32_t>> tables{{0, 1}}, ring{{0}};
  BatchState qwen{16, {{20, tables[0], ring[0]}}};
  EXPECT_THROW(make_plan(preset_config("tiny"), qwen, policy_by_name("default"), PlanOptions{.n_sms = 2}), Error);
}

// The full shape: 13 full and 36 sliding layers of 4096; at 32K and batch 1 the step reads
// (13 x 32768 + 36 x 4096) / (49 x 32768) of full attention's KV; at 8K and 32K, batch 1 and 8,
// the plan validates and the timing model runs.
// The expert-up shares of a parallel block lean away from the SMs that run the layer's attention
// items (planner_assemble.cpp balance_up_shares): at batch 1 and 8K every SM with an item of a
// layer has a smaller share than every SM without one; the shares tile their units (the validator),
// and equal-up-shares gives every SM (s, s + 1, S). The simulated steps of both are printed.
TEST(NorthPlan, UpSharesLeanAwayFromTheAttentionSms) {
  const ModelConfig c = preset_config("north-mini-code");
  const NorthBatch b = north_batch(c, {8192}, 16);
  const Plan plan = make_plan(c, b.state, policy_by_name("default"), PlanOptions{.n_sms = 132});
  ASSERT_NO_THROW(validate_plan(plan)) << validation_error(plan);
  const Plan equal = make_plan(c, b.state, policy_by_name("equal-up-shares"), PlanOptions{.n_sms = 132});
  ASSERT_NO_THROW(validate_plan(equal)) << validation_error(equal);
  int layers = 0, sliding = 0;
  for (int L = 0; L < c.n_layers; ++L) {
    if (c.layers[L].ffn != FfnKind::kMoe) continue;
    int32_t attn_max = 0, other_min = 1 << 30, with = 0;
    for (int m = 0; m < 132; ++m) {
      const Task& t = plan.tasks[test::find_task(plan, Op::kExpertUp, L, m)];
      const Task& e = equal.tasks[test::find_task(equal, Op::kExpertUp, L, m)];
      ASSERT_EQ(e.arg[0], m);
      ASSERT_EQ(e.arg[1], m + 1);
      ASSERT_EQ(e.arg[2], 132);
      const int32_t w = t.arg[1] - t.arg[0];
      ASSERT_GT(w, 0);
      if (test::tasks_of(plan, Op::kAttn, L, m).empty()) {
        other_min = std::min(other_min, w);
      } else {
        attn_max = std::max(attn_max, w);
        ++with;
      }
    }
    ++layers;
    if (with < 132) {
      EXPECT_LT(attn_max, other_min) << "L" << L << ": " << with << " SMs with items";
      sliding += c.layers[L].sliding_window > 0;
    }
  }
  EXPECT_GT(layers, 40);
  EXPECT_EQ(sliding, 36);  // (the full layers' 128 items leave 4 SMs without one: they lean too)
  std::printf("north-mini-code batch 1 8K on the H100 model: balanced up shares %.1f us, equal %.1f us\n",
              simulate_plan(plan, v3_h100_params()).step_us, simulate_plan(equal, v3_h100_params()).step_us);
}

TEST(NorthPlan, FullShapeReadsTheWindowOnlyAndSimulates) {
  const ModelConfig c = preset_config("north-mini-code");
  int full = 0, sliding = 0;
  for (const LayerSpec& l : c.layers) (l.sliding_window ? sliding : full) += 1;
  ASSERT_EQ(full, 13);
  ASSERT_EQ(sliding, 36);
  for (int batch : {1, 8})
    for (int ctx : {8192, 32768}) {
      const NorthBatch b = north_batch(c, std::vector<int>(batch, ctx), 16);
      const Plan plan = make_plan(c, b.state, policy_by_name("default"), PlanOptions{.n_sms = 132});
      ASSERT_NO_THROW(validate_plan(plan)) << validation_error(plan);
      const PlanStats st = plan_stats(plan);
      const double want = (13.0 * ctx + 36.0 * 4096) / (49.0 * ctx);
      EXPECT_NEAR(static_cast<double>(st.kv_bytes_read) / st.kv_bytes_full_attention, want, 1e-9)
          << "batch " << batch << " context " << ctx;
      EXPECT_EQ(st.kv_bytes_full_attention, int64_t{49} * batch * ctx * 4 * 128 * 4);
      if (batch == 1 && ctx == 8192) {
        const SimResult sim = simulate_plan(plan, v3_h200_params());
        EXPECT_GT(sim.step_us, 0);
        Policy hold = policy_by_name("router-after-attn");
        const Plan held = make_plan(c, b.state, hold, PlanOptions{.n_sms = 132});
        validate_plan(held);
        const SimResult sim_held = simulate_plan(held, v3_h200_params());
        std::printf("north-mini-code batch 1 8K: %.1f us, router held until attention ends %.1f us\n", sim.step_us,
                    sim_held.step_us);
      }
    }
  EXPECT_NEAR((13.0 * 32768 + 36.0 * 4096) / (49.0 * 32768), 0.357, 5e-4);
}

}  // namespace
}  // namespace megadecode
