// Tests for the planner: every random (shape, batch, policy, SM count) gives a plan the validator
// accepts, whose tiles cover every output exactly once, dealt as the policy says; the full
// qwen3-30b-a3b shape plans at batch 1 and 64; bad batches are clear errors.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "core/check.h"
#include "plan/planner.h"
#include "plan/stats.h"
#include "plan/validator.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

using test::random_batch;
using test::random_config;
using test::random_policy;

// Each output element of each layer's static ops is produced by exactly one task.
void check_coverage(const Plan& plan) {
  const PlanShape& s = plan.params.shape;
  std::map<std::pair<int, int>, std::vector<int>> hits;  // (layer, op) -> count per output element
  auto mark = [&](int layer, Op op, int size, int begin, int end) {
    auto& v = hits[{layer, static_cast<int>(op)}];
    if (v.empty()) v.assign(size, 0);
    ASSERT_TRUE(begin >= 0 && begin < end && end <= size) << op_name(op) << " range " << begin << ".." << end;
    for (int i = begin; i < end; ++i) ++v[i];
  };
  for (const Task& t : plan.tasks) {
    const Op op = static_cast<Op>(t.op);
    switch (op) {
      case Op::kAttnNorm:
      case Op::kMoeNorm:
      case Op::kFinalNorm:
      case Op::kSample: mark(t.layer, op, s.batch, t.arg[0], t.arg[1]); break;
      case Op::kQkv: mark(t.layer, op, s.n_kv_heads * s.qkv_group_rows, t.arg[0] * s.qkv_group_rows + t.arg[1], t.arg[0] * s.qkv_group_rows + t.arg[2]); break;
      case Op::kOProj: mark(t.layer, op, s.n_kv_heads * s.hidden, t.arg[0] * s.hidden + t.arg[1], t.arg[0] * s.hidden + t.arg[2]); break;
      case Op::kRouter: mark(t.layer, op, s.n_experts, t.arg[0], t.arg[1]); break;
      case Op::kLmHead: mark(t.layer, op, s.vocab, t.arg[0], t.arg[1]); break;
      case Op::kDispatch: mark(t.layer, op, 1, 0, 1); break;
      default: break;
    }
  }
  for (const auto& [key, v] : hits)
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], 1) << "layer " << key.first << " " << op_name(static_cast<Op>(key.second)) << " element " << i;
  const int expected_ops = 6 * s.n_layers + (s.lm_head ? 2 : 0) + (s.sample ? 1 : 0);
  EXPECT_EQ(static_cast<int>(hits.size()), expected_ops);
}

void check_dealing(const Plan& plan, const Policy& policy) {
  const int S = plan.n_sms();
  std::vector<std::vector<int>> per_wave(plan.waves.size());  // SMs of a wave's tasks, in list order of SMs
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) per_wave[plan.task_wave[i]].push_back(plan.sm_of(i));
  int cursor = 0;
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const WaveInfo& wave = plan.waves[w];
    std::vector<int> count(S, 0);
    for (int sm : per_wave[w]) ++count[sm];
    if (op_is_drain(wave.op)) {
      for (int sm = 0; sm < S; ++sm) ASSERT_EQ(count[sm], 1) << "drain wave " << w << " on SM " << sm;
      continue;
    }
    const int start = policy.deal == WaveDeal::kRotate ? cursor : 0;
    for (int k = 0; k < wave.n_tasks; ++k) --count[(start + k) % S];
    for (int sm = 0; sm < S; ++sm) ASSERT_EQ(count[sm], 0) << "wave " << w << " (" << op_name(wave.op) << ") on SM " << sm;
    cursor = (start + wave.n_tasks) % S;
  }
}

TEST(Planner, RandomPlansValidateCoverAndDeal) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const ModelConfig c = random_config(rng);
    const std::string name = policy_names()[rng.below(policy_names().size())];
    const Policy p = random_policy(rng, name);
    const int batch = 1 + static_cast<int>(rng.below(rng.below(2) ? 64 : 5));
    test::RandomBatch rb = random_batch(rng, batch, test::pick(rng, {1, 17, 300, 4096}), test::pick(rng, {1, 4, 16}));
    PlanOptions o;
    o.n_sms = test::pick(rng, {1, 2, 3, 8, 13, 132});
    o.lm_head = rng.below(4) != 0;
    o.sample = o.lm_head && rng.below(2);
    SCOPED_TRACE(cat("seed ", seed, " iter ", iter, " policy ", name, " batch ", batch, " sms ", o.n_sms));
    const Plan plan = make_plan(c, rb.state, p, o);
    ASSERT_NO_THROW(validate_plan(plan));
    check_coverage(plan);
    check_dealing(plan, p);
    const PlanStats st = plan_stats(plan);
    EXPECT_GE(st.critical_path_tasks_ordered, st.critical_path_tasks);
    EXPECT_EQ(st.critical_path_tasks, static_cast<int>(plan.waves.size()));  // the layer chain is sequential
    if (p.grid_sync) {
      for (size_t i = 0; i < plan.tasks.size(); ++i) {
        if (plan.task_wave[i] > 0) {
          ASSERT_EQ(plan.tasks[i].n_waits, 1);
        }
      }
    }
  }
}

TEST(Planner, AttentionSplitsScaleWithContextAndStayWithinCapacity) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  for (int iter = 0; iter < 100; ++iter) {
    const int batch = 1 + static_cast<int>(rng.below(64));
    test::RandomBatch rb = random_batch(rng, batch, 1 + static_cast<int>(rng.below(8192)), 16);
    Policy p = policy_by_name("default");
    p.attn_min_split_tokens = test::pick(rng, {16, 64, 256});
    p.attn_max_splits = test::pick(rng, {2, 16, 64});
    const Plan plan = make_plan(c, rb.state, p, {});
    const PlanShape& s = plan.params.shape;
    ASSERT_LE(s.n_attn_items, s.attn_capacity) << "seed " << seed << " iter " << iter;
    for (const AttnItem& it : plan.attn_items) {
      ASSERT_LE(it.n_splits, p.attn_max_splits);
      const int n_ctx = rb.state.seqs[it.seq].n_ctx;
      if (it.split + 1 < it.n_splits) {
        ASSERT_GE(it.pos_end - it.pos_begin, p.attn_min_split_tokens) << "split too short";
        ASSERT_EQ((it.pos_end - it.pos_begin) % 16, 0) << "splits end on block edges";
      }
      if (it.split + 1 == it.n_splits) {
        ASSERT_EQ(it.pos_end, n_ctx);
      }
    }
  }
  // A long context at batch 1 fills the SMs; a short one is a single split.
  std::vector<int32_t> table(512);
  std::iota(table.begin(), table.end(), 0);
  BatchState longctx{16, {{8192, table}}};
  Plan plan = make_plan(c, longctx, policy_by_name("default"), {});
  EXPECT_EQ(plan.attn_items.size(), 4u * 32);  // 8192 tokens in 256-token splits, 4 KV groups
  BatchState shortctx{16, {{100, table}}};
  plan = make_plan(c, shortctx, policy_by_name("default"), {});
  EXPECT_EQ(plan.attn_items.size(), 4u);
}

// A sequence's attention items (split count and token ranges) are the same whatever batch it sits
// in: the merge order, and so its logits, must not change with the batch (batch invariance).
TEST(Planner, AttentionSplitOfASequenceIgnoresTheRestOfTheBatch) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  auto ranges = [](const Plan& plan, int seq, int group) {
    std::vector<std::pair<int, int>> r;
    for (const AttnItem& it : plan.attn_items)
      if (it.seq == seq && it.group == group) r.emplace_back(it.pos_begin, it.pos_end);
    return r;
  };
  for (int iter = 0; iter < 50; ++iter) {
    const int batch = 2 + static_cast<int>(rng.below(63));
    test::RandomBatch rb = random_batch(rng, batch, 1 + static_cast<int>(rng.below(32768)), 16);
    const Plan whole = make_plan(c, rb.state, policy_by_name("default"), {});
    const int probe = static_cast<int>(rng.below(batch));
    BatchState alone{16, {rb.state.seqs[probe]}};
    const Plan one = make_plan(c, alone, policy_by_name("default"), {});
    for (int g = 0; g < c.n_kv_heads; ++g)
      ASSERT_EQ(ranges(one, 0, g), ranges(whole, probe, g))
          << "seed " << seed << " iter " << iter << ": context " << rb.state.seqs[probe].n_ctx << " in a batch of " << batch;
  }
}

TEST(Planner, FullShapeAtBatch1And64) {
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  for (int batch : {1, 64}) {
    std::vector<std::vector<int32_t>> tables(batch);
    BatchState st{16, {}};
    for (int i = 0; i < batch; ++i) {
      tables[i].resize(64);
      std::iota(tables[i].begin(), tables[i].end(), i * 64);
      st.seqs.push_back({1 + (i * 997) % 1024, tables[i]});
    }
    for (const std::string& name : policy_names()) {
      const Plan plan = make_plan(c, st, policy_by_name(name), {});
      ASSERT_NO_THROW(validate_plan(plan)) << name << " batch " << batch;
      const PlanShape& s = plan.params.shape;
      EXPECT_EQ(s.qkv_tiles_per_group * s.n_kv_heads, 160);  // 32-row tiles of 128 KiB
      EXPECT_EQ(s.o_row_blocks * s.n_kv_heads, 128);
      EXPECT_EQ(s.router_tiles, 4);
      EXPECT_EQ(s.up_cols, 16);
      EXPECT_EQ(s.down_rows, 80);
      EXPECT_EQ(s.up_capacity, std::min(128, batch * 8) * s.up_blocks);
    }
  }
}

TEST(Planner, LayoutsAreDisjointAndAligned) {
  SplitMix64 rng(test_seed());
  const ModelConfig c = random_config(rng);
  test::RandomBatch rb = random_batch(rng, 5, 100, 4);
  const Plan plan = make_plan(c, rb.state, policy_by_name("grid-sync"), {});
  std::vector<BufferSpan> spans;
#define COLLECT(name, type, shape) spans.push_back(plan.params.buffers.name);
  MD_BUFFERS(COLLECT)
#undef COLLECT
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].offset % 256, 0u);
    EXPECT_LE(spans[i].offset + spans[i].bytes, plan.params.buffers.total_bytes);
    if (i > 0) {
      EXPECT_GE(spans[i].offset, spans[i - 1].offset + spans[i - 1].bytes);
    }
  }
  std::set<int> kinds_seen;
  for (const CounterInfo& ci : plan.counters) EXPECT_NE(ci.kind, CounterKind::kUnused);
  EXPECT_EQ(plan.params.counters.stride_bytes, 128);
}

std::string plan_error(const ModelConfig& c, const BatchState& b) {
  try {
    make_plan(c, b, policy_by_name("default"), {});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Planner, BadBatchesAreClearErrors) {
  const ModelConfig c = preset_config("tiny");
  std::vector<int32_t> t1{0, 1}, t2{1, 2}, t3{0};
  EXPECT_NE(plan_error(c, BatchState{16, {}}).find("at least one sequence"), std::string::npos);
  EXPECT_NE(plan_error(c, BatchState{16, {{40, t3}}}).find("block table has 1 blocks"), std::string::npos);
  EXPECT_NE(plan_error(c, BatchState{16, {{0, t3}}}).find("context length 0"), std::string::npos);
  // Both sequences' new tokens would land in block 1, offset 3.
  EXPECT_NE(plan_error(c, BatchState{16, {{20, t1}, {4, t2}}}).find("also another sequence's new slot"), std::string::npos);
  ModelConfig dense = c;
  dense.layers[1].ffn = FfnKind::kDense;
  EXPECT_NE(plan_error(dense, BatchState{16, {{1, t3}}}).find("layer 1 is dense"), std::string::npos);
  EXPECT_THROW(policy_by_name("fastest"), Error);
}

}  // namespace
}  // namespace megadecode
