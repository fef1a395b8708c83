// Tests for the planner: every random (shape, batch, policy, SM count) gives a plan the validator
// accepts, whose tiles are sized to the SM count and cover every output exactly once, dealt as
// planner.h says (GEMM tiles round-robin continuing across waves, attention items largest first on
// the least-loaded SM, expert share s on SM s); the full qwen3-30b-a3b shape at batch 1 and 64; the
// attention split of a sequence ignores the rest of the batch; the MoE share formula; bad inputs
// are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "core/check.h"
#include "plan/moe_split.h"
#include "plan/planner.h"
#include "plan/planner_internal.h"
#include "plan/stats.h"
#include "plan/tile_cut.h"
#include "plan/validator.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

using test::random_batch;
using test::random_config;
using test::random_policy;

int ceil16(int n) { return (n + 15) / 16; }

// 16-row blocks of a GEMM op's weight matrix (0: not a GEMM op).
int gemm_row_blocks(const PlanShape& s, Op op) {
  switch (op) {
    case Op::kQkv: return s.n_kv_heads * s.qkv_group_rows / 16;
    case Op::kOProj: return s.hidden / 16;
    case Op::kRouter: return ceil16(s.n_experts);
    case Op::kLmHead: return ceil16(s.vocab);
    default: return 0;
  }
}

// The tile count planner.h promises: min(row blocks, tiles_per_sm * SMs); QKV per KV group.
int expected_tiles(const PlanShape& s, const Policy& p, Op op) {
  const int max_tiles = p.tiles_per_sm * s.n_sms;
  if (op == Op::kQkv) return s.n_kv_heads * std::clamp(max_tiles / s.n_kv_heads, 1, s.qkv_group_rows / 16);
  return std::min(max_tiles, gemm_row_blocks(s, op));
}

// Each layer's GEMM row blocks, SAMPLE tokens, attention items and MoE shares are done exactly
// once, by as many tiles as the SM count gives, of (almost) equal size; QKV tiles stay inside one
// KV group and arrive on that group's counter.
void check_coverage(const Plan& plan, const Policy& policy) {
  const PlanShape& s = plan.params.shape;
  const CounterLayout& c = plan.params.counters;
  std::map<std::pair<int, int>, std::vector<int>> hits;  // (layer, op) -> count per row block / token / item / share
  std::map<std::pair<int, int>, std::vector<int>> sizes;  // (layer, op) -> GEMM tile sizes in row blocks
  auto mark = [&](int layer, Op op, int n, int begin, int end) {
    auto& v = hits[{layer, static_cast<int>(op)}];
    if (v.empty()) v.assign(n, 0);
    ASSERT_TRUE(begin >= 0 && begin < end && end <= n) << op_name(op) << " range " << begin << ".." << end << " of " << n;
    for (int i = begin; i < end; ++i) ++v[i];
  };
  const int group_rbs = s.qkv_group_rows / 16;
  for (const Task& t : plan.tasks) {
    const Op op = static_cast<Op>(t.op);
    if (const int n = gemm_row_blocks(s, op); n > 0) {
      mark(t.layer, op, n, t.arg[0], t.arg[1]);
      sizes[{t.layer, t.op}].push_back(t.arg[1] - t.arg[0]);
      if (op == Op::kQkv) {
        const int g = t.arg[0] / group_rbs;
        ASSERT_EQ((t.arg[1] - 1) / group_rbs, g) << "QKV tile " << t.arg[0] << ".." << t.arg[1] << " straddles groups";
        ASSERT_EQ(t.arrive[0].counter, layer_counter(c, t.layer, c.qkv_done + g));
      }
    } else if (op == Op::kSample) {
      mark(t.layer, op, s.batch, t.arg[0], t.arg[1]);
    } else if (op == Op::kAttn) {
      mark(t.layer, op, s.n_attn_items, t.arg[0], t.arg[0] + 1);
    } else {
      ASSERT_TRUE(op_is_routed(op));
      ASSERT_EQ(t.arg[2], s.n_sms) << "one share per SM";
      mark(t.layer, op, s.n_sms, t.arg[0], t.arg[1]);
    }
  }
  for (const auto& [key, v] : hits)
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], 1) << "L" << key.first << " " << op_name(static_cast<Op>(key.second)) << " element " << i;
  const int expected_ops = 6 * s.n_layers + (s.lm_head ? 1 : 0) + (s.sample ? 1 : 0);
  EXPECT_EQ(static_cast<int>(hits.size()), expected_ops);
  for (const auto& [key, v] : sizes) {
    const Op op = static_cast<Op>(key.second);
    ASSERT_EQ(static_cast<int>(v.size()), expected_tiles(s, policy, op)) << op_name(op) << " L" << key.first;
    // Equal weight bytes to within one row block (QKV: inside each group).
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    ASSERT_LE(*hi - *lo, 1) << op_name(op) << " L" << key.first << " tiles of " << *lo << " to " << *hi << " row blocks";
  }
  EXPECT_EQ(s.n_qkv_tasks, expected_tiles(s, policy, Op::kQkv));
  EXPECT_EQ(s.n_oproj_tasks, expected_tiles(s, policy, Op::kOProj));
  EXPECT_EQ(s.n_router_tasks, expected_tiles(s, policy, Op::kRouter));
  EXPECT_EQ(s.n_lm_tasks, expected_tiles(s, policy, Op::kLmHead));
}

// Where planner.h says each wave's tasks go.
void check_dealing(const Plan& plan) {
  const int S = plan.n_sms();
  std::vector<std::vector<int>> per_wave(plan.waves.size());  // tasks of each wave
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) per_wave[plan.task_wave[i]].push_back(i);
  int cursor = 0;
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const WaveInfo& wave = plan.waves[w];
    std::vector<int>& tasks = per_wave[w];
    ASSERT_EQ(static_cast<int>(tasks.size()), wave.n_tasks);
    if (op_is_routed(wave.op)) {
      for (int i : tasks) ASSERT_EQ(plan.tasks[i].arg[0], plan.sm_of(i)) << op_name(wave.op) << " share on another SM";
      continue;
    }
    if (wave.op == Op::kAttn) {
      // Largest first on the least-loaded SM: loads end within one item of each other, and with
      // no more items than SMs every SM runs at most one.
      std::vector<int64_t> load(S, 0);
      std::vector<int> count(S, 0);
      int64_t longest = 0;
      for (int i : tasks) {
        const AttnItem& it = plan.attn_items[plan.tasks[i].arg[0]];
        load[plan.sm_of(i)] += it.pos_end - it.pos_begin;
        ++count[plan.sm_of(i)];
        longest = std::max<int64_t>(longest, it.pos_end - it.pos_begin);
      }
      const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      ASSERT_LE(*hi - *lo, longest) << "attention wave " << w << " is unbalanced";
      if (wave.n_tasks <= S) {
        ASSERT_EQ(*std::max_element(count.begin(), count.end()), 1);
      }
      continue;
    }
    // Round-robin in row-block (or token) order, starting where the previous dealt wave ended.
    std::sort(tasks.begin(), tasks.end(), [&](int a, int b) { return plan.tasks[a].arg[0] < plan.tasks[b].arg[0]; });
    for (int k = 0; k < wave.n_tasks; ++k)
      ASSERT_EQ(plan.sm_of(tasks[k]), (cursor + k) % S) << "wave " << w << " (" << op_name(wave.op) << ") tile " << k;
    cursor = (cursor + wave.n_tasks) % S;
  }
}

// Under grid-sync every task after the first wave waits on all of the previous wave, only.
void check_grid_sync(const Plan& plan) {
  const CounterLayout& c = plan.params.counters;
  ASSERT_GE(c.wave_done, 0);
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    const int w = plan.task_wave[i];
    ASSERT_EQ(t.n_waits, w > 0 ? 1 : 0) << describe_task(plan, static_cast<int>(i));
    if (w > 0) {
      EXPECT_EQ(t.wait[0].counter, c.wave_done + w - 1);
      EXPECT_EQ(t.wait[0].target, plan.waves[w - 1].n_tasks);
    }
    EXPECT_EQ(t.arrive[t.n_arrives - 1].counter, c.wave_done + w);
  }
}

// MD_OPS' third column, the form every kernel dispatches on: attention, sampling, the rest GEMMs; a
// value past the table is no op (the megakernel refuses it: megakernel_runs).
TEST(OpTable, FormsComeFromTheTable) {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const OpForm want = op == Op::kAttn     ? OpForm::kAttn
                        : op == Op::kSample ? OpForm::kSample
                        : op == Op::kLmHead ? OpForm::kLogits
                                            : OpForm::kGemm;
    EXPECT_EQ(op_form(op), want) << op_name(op);
  }
  EXPECT_EQ(op_form(static_cast<Op>(kNumOps)), OpForm::kNone);
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
    SCOPED_TRACE(cat("seed ", seed, " iter ", iter, " policy ", name, " tiles/SM ", p.tiles_per_sm, " batch ", batch,
                     " sms ", o.n_sms));
    const Plan plan = make_plan(c, rb.state, p, o);
    ASSERT_NO_THROW(validate_plan(plan));
    check_coverage(plan, p);
    check_dealing(plan);
    if (p.grid_sync) check_grid_sync(plan);
    const PlanStats st = plan_stats(plan);
    EXPECT_GE(st.critical_path_tasks_ordered, st.critical_path_tasks);
    EXPECT_EQ(st.critical_path_tasks, static_cast<int>(plan.waves.size()));  // every wave waits on the one before
  }
}

// The attention items of a step: per (sequence, group) consecutive splits covering the context,
// every split but the last at least the minimum and on KV block edges, at most the maximum count.
// place_attention (a heap, one placement for every layer) against the rule written out: each
// item, largest first (ties: lower index), to the SM with the fewest key positions so far (ties:
// the first SM at or after the wave's cursor), for any cursor.
TEST(Planner, AttentionPlacementIsLargestFirstOnTheLeastLoadedSm) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 300; ++round) {
    const int n_sms = 1 + static_cast<int>(rng.below(40));
    std::vector<AttnItem> items(rng.below(120) + 1);
    for (AttnItem& it : items) {
      it.pos_begin = 0;
      it.pos_end = 1 + static_cast<int>(rng.below(rng.below(2) ? 4 : 300));  // many ties, or few
    }
    const std::vector<int> rel = place_attention(items, n_sms);
    const int cursor = static_cast<int>(rng.below(n_sms));
    std::vector<int> order(items.size());
    std::iota(order.begin(), order.end(), 0);
    auto len = [&](int i) { return items[i].pos_end - items[i].pos_begin; };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len(a) > len(b); });
    std::vector<int64_t> load(n_sms, 0);
    for (int i : order) {
      int best = -1;
      for (int k = 0; k < n_sms; ++k) {
        const int sm = (cursor + k) % n_sms;
        if (best < 0 || load[sm] < load[best]) best = sm;
      }
      load[best] += len(i);
      ASSERT_EQ((rel[i] + cursor) % n_sms, best) << "round " << round << " item " << i;
    }
  }
}

TEST(Planner, AttentionSplitsScaleWithContext) {
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
    SCOPED_TRACE(cat("seed ", seed, " iter ", iter));
    std::map<std::pair<int, int>, int> covered;  // (seq, group) -> positions so far
    for (const AttnItem& it : plan.attn_items) {
      ASSERT_LE(it.n_splits, p.attn_max_splits);
      const int n_ctx = rb.state.seqs[it.seq].n_ctx;
      int& next = covered[{it.seq, it.group}];
      ASSERT_EQ(it.pos_begin, next);
      next = it.pos_end;
      if (it.split + 1 < it.n_splits) {
        ASSERT_GE(it.pos_end - it.pos_begin, p.attn_min_split_tokens) << "split too short";
        ASSERT_EQ((it.pos_end - it.pos_begin) % 16, 0) << "splits end on block edges";
      } else {
        ASSERT_EQ(it.pos_end, n_ctx);
      }
    }
    ASSERT_EQ(static_cast<int>(covered.size()), batch * c.n_kv_heads);
  }
  // A long context at batch 1 fills the SMs; a short one is a single split.
  std::vector<int32_t> table(512);
  std::iota(table.begin(), table.end(), 0);
  BatchState longctx{16, {{8192, table}}};
  Plan plan = make_plan(c, longctx, policy_by_name("default"), {});
  EXPECT_EQ(plan.attn_items.size(), 4u * 32);  // 8192 tokens in 256-token splits, 4 KV groups
  EXPECT_EQ(make_plan(c, longctx, policy_by_name("long-splits"), {}).attn_items.size(), 4u * 16);  // 512-token splits
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

// The counts of the full model on an H200's 132 SMs.
TEST(Planner, FullShapeTilesAreSizedToTheSms) {
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
      SCOPED_TRACE(cat(name, " batch ", batch));
      const Policy policy = policy_by_name(name);
      const Plan plan = make_plan(c, st, policy, {});
      ASSERT_NO_THROW(validate_plan(plan));
      check_coverage(plan, policy);
      const PlanShape& s = plan.params.shape;
      EXPECT_EQ(s.n_sms, 132);
      EXPECT_EQ(s.n_qkv_tasks, 132);  // 33 per KV group of 80 row blocks
      EXPECT_EQ(test::tasks_of(plan, Op::kQkv, 5).size(), 132u);
      EXPECT_EQ(s.n_oproj_tasks, 128);  // one per row block of the hidden size
      EXPECT_EQ(s.n_router_tasks, 8);   // 128 experts
      EXPECT_EQ(s.n_lm_tasks, 132);
      EXPECT_EQ(s.up_units, 96);  // 768 gate + 768 up rows in 16-row blocks
      EXPECT_EQ(s.down_rbs, 128);
      EXPECT_EQ(plan.waves.size(), 48u * 6 + 2);
      // Every SM runs one EXPERT_UP and one EXPERT_DOWN of every layer.
      for (int sm = 0; sm < 132; ++sm)
        for (int L = 0; L < 48; ++L) {
          ASSERT_EQ(test::tasks_of(plan, Op::kExpertUp, L, sm).size(), 1u) << "SM " << sm << " L" << L;
          ASSERT_EQ(test::tasks_of(plan, Op::kExpertDown, L, sm).size(), 1u) << "SM " << sm << " L" << L;
        }
      // QKV tiles and the LM head put one tile on every SM.
      for (int sm = 0; sm < 132; ++sm) ASSERT_EQ(test::tasks_of(plan, Op::kQkv, 0, sm).size(), 1u) << sm;
      for (int sm = 0; sm < 132; ++sm) ASSERT_EQ(test::tasks_of(plan, Op::kLmHead, -1, sm).size(), 1u) << sm;
    }
  }
  // Two tiles per SM where the op has the row blocks for them.
  std::vector<int32_t> table(1, 0);
  Policy two = policy_by_name("default");
  two.tiles_per_sm = 2;
  const Plan plan = make_plan(c, BatchState{16, {{1, table}}}, two, {});
  EXPECT_EQ(plan.params.shape.n_qkv_tasks, 264);
  EXPECT_EQ(plan.params.shape.n_oproj_tasks, 128);
  EXPECT_EQ(plan.params.shape.n_router_tasks, 8);
  EXPECT_EQ(plan.params.shape.n_lm_tasks, 264);
  // More SMs than a KV group has row blocks: one row block per QKV tile (the two-layer `small`
  // preset has the full widths).
  PlanOptions wide;
  wide.n_sms = 4096;
  const Plan w = make_plan(preset_config("small"), BatchState{16, {{1, table}}}, policy_by_name("default"), wide);
  EXPECT_EQ(w.params.shape.n_qkv_tasks, 320);
  EXPECT_NO_THROW(validate_plan(w));
}

// Share s of S of n items is [n*s/S, n*(s+1)/S): contiguous, covering [0, n) once, sizes within one.
TEST(MoeSplit, SharesCoverTheItemsOnceAndEvenly) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int iter = 0; iter < 1000; ++iter) {
    const int32_t n = static_cast<int32_t>(rng.below(iter % 10 == 0 ? 1 << 20 : 300));
    const int32_t shares = 1 + static_cast<int32_t>(rng.below(iter % 7 == 0 ? 4096 : 140));
    int32_t next = 0, lo = n, hi = 0;
    for (int32_t s = 0; s < shares; ++s) {  // equal shares
      const MoeShare sh = moe_share(n, s, s + 1, shares);
      ASSERT_EQ(sh.begin, next) << "seed " << seed << " n " << n << " shares " << shares << " share " << s;
      ASSERT_LE(sh.begin, sh.end);
      lo = std::min(lo, sh.end - sh.begin);
      hi = std::max(hi, sh.end - sh.begin);
      next = sh.end;
    }
    ASSERT_EQ(next, n);
    ASSERT_LE(hi - lo, 1) << "n " << n << " shares " << shares;
    // Weighted shares: contiguous, each within one item of its weight's part.
    std::vector<int32_t> at(1, 0);
    for (int32_t s = 0; s < shares; ++s) at.push_back(at.back() + 1 + static_cast<int32_t>(rng.below(2000)));
    next = 0;
    for (int32_t s = 0; s < shares; ++s) {
      const MoeShare sh = moe_share(n, at[s], at[s + 1], at.back());
      ASSERT_EQ(sh.begin, next) << "seed " << seed << " n " << n << " share " << s;
      const double want = static_cast<double>(n) * (at[s + 1] - at[s]) / at.back();
      ASSERT_LT(std::abs((sh.end - sh.begin) - want), 1.0) << "seed " << seed << " n " << n << " share " << s;
      next = sh.end;
    }
    ASSERT_EQ(next, n);
  }
  // Large counts do not overflow: 132 SMs of 128 experts x 96 units x 2^14.
  EXPECT_EQ(moe_share(128 * 96 << 14, 131, 132, 132).end, 128 * 96 << 14);
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
  const PlanShape& s = plan.params.shape;
  EXPECT_EQ(plan.params.buffers.qkv.bytes, static_cast<uint64_t>(s.batch) * s.n_kv_heads * s.qkv_group_rows * 4);
  EXPECT_EQ(plan.params.buffers.attn_part_o.bytes,
            static_cast<uint64_t>(s.n_attn_items) * s.group_size * s.head_dim * 4);
  EXPECT_EQ(plan.params.buffers.act.bytes, static_cast<uint64_t>(s.batch) * s.top_k * s.moe_inter * 4);
  for (const CounterInfo& ci : plan.counters) EXPECT_NE(ci.kind, CounterKind::kUnused);
  EXPECT_EQ(plan.params.counters.stride_bytes, 128);
}

std::string plan_error(const ModelConfig& c, const BatchState& b, const Policy& p = policy_by_name("default"),
                       const PlanOptions& o = {}) {
  try {
    make_plan(c, b, p, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Planner, BadInputsAreClearErrors) {
  const ModelConfig c = preset_config("tiny");
  std::vector<int32_t> t1{0, 1}, t2{1, 2}, t3{0};
  EXPECT_NE(plan_error(c, BatchState{16, {}}).find("at least one sequence"), std::string::npos);
  EXPECT_NE(plan_error(c, BatchState{16, {{40, t3}}}).find("block table has 1 blocks"), std::string::npos);
  EXPECT_NE(plan_error(c, BatchState{16, {{0, t3}}}).find("context length 0"), std::string::npos);
  // Both sequences' new tokens would land in block 1, offset 3.
  EXPECT_NE(plan_error(c, BatchState{16, {{20, t1}, {4, t2}}}).find("also another sequence's new slot"), std::string::npos);
  const BatchState one{16, {{1, t3}}};
  ModelConfig dense = c;
  dense.layers[1].ffn = FfnKind::kDense;
  EXPECT_NE(plan_error(dense, one).find("layer 1 is dense"), std::string::npos);
  ModelConfig odd = c;
  odd.hidden_size = 120;
  EXPECT_NE(plan_error(odd, one).find("multiples of 16"), std::string::npos);
  Policy zero = policy_by_name("default");
  zero.tiles_per_sm = 0;
  EXPECT_NE(plan_error(c, one, zero).find("non-positive"), std::string::npos);
  zero.tiles_per_sm = 1 << 20;  // tiles_per_sm x SMs must not overflow
  EXPECT_NE(plan_error(c, one, zero).find("at most 4096"), std::string::npos);
  PlanOptions no_sms;
  no_sms.n_sms = 0;
  EXPECT_NE(plan_error(c, one, policy_by_name("default"), no_sms).find("--sms"), std::string::npos);
  PlanOptions sample_only;
  sample_only.lm_head = false;
  EXPECT_NE(plan_error(c, one, policy_by_name("default"), sample_only).find("sampling needs the LM head"),
            std::string::npos);
  try {
    policy_by_name("fastest");
    ADD_FAILURE() << "unknown policy accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grid-sync"), std::string::npos) << e.what();  // names the known ones
  }
}

// A static op's tile is named by its first row block (plan/tile_cut.h): the LM head's tiles index
// their LogitBest entries so. Every (n_rbs, n <= n_rbs) of a range, and the planner's own LM head.
TEST(Planner, TileOfBeginInvertsTheCut) {
  for (int n_rbs = 1; n_rbs <= 300; ++n_rbs)
    for (int n = 1; n <= n_rbs; ++n)
      for (int i = 0; i < n; ++i) {
        const int32_t b = tile_begin(7, n_rbs, n, i);
        ASSERT_LT(b, tile_begin(7, n_rbs, n, i + 1)) << n_rbs << " " << n << " " << i;  // never empty
        ASSERT_EQ(tile_of_begin(7, n_rbs, n, b), i) << n_rbs << " " << n << " " << i;
      }
  for (const int32_t vocab : {151936, 262144, 1000}) {
    const int n_rbs = (vocab + 15) / 16;
    for (const int n : {132, 114, 1, n_rbs})
      for (int i = 0; i < n && n <= n_rbs; ++i) ASSERT_EQ(tile_of_begin(0, n_rbs, n, tile_begin(0, n_rbs, n, i)), i);
  }
  SplitMix64 rng(test_seed());
  ModelConfig c = random_config(rng);
  test::RandomBatch rb = random_batch(rng, 3, 50, 4);
  const Plan plan = make_plan(c, rb.state, policy_by_name("default"), {});
  const PlanShape& s = plan.params.shape;
  std::vector<int> seen(s.n_lm_tasks, 0);
  for (const Task& t : plan.tasks)
    if (static_cast<Op>(t.op) == Op::kLmHead) ++seen.at(tile_of_begin(0, (s.vocab + 15) / 16, s.n_lm_tasks, t.arg[0]));
  EXPECT_EQ(seen, std::vector<int>(s.n_lm_tasks, 1));
  EXPECT_EQ(plan.params.buffers.lm_best.bytes, static_cast<uint64_t>(s.n_lm_tasks) * s.batch * sizeof(LogitBest));
}

}  // namespace
}  // namespace megadecode
