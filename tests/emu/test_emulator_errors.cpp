// The emulator's failure modes are Errors, never hangs or silent wrong answers: a wait that can
// never be satisfied times out naming SM, task, counter, value and target (threaded) or fails at
// once (sequential); an attention item run twice trips its split counter; an extra arrival is
// caught by the end-of-step counter check; rows no tile computes stay poisoned (NaN) and are caught
// where the routing reads them, or show in the logits; bad inputs are rejected.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "../plan/plan_test_util.h"
#include "../ref/ref_test_util.h"
#include "core/check.h"
#include "emu/emulator.h"
#include "plan/planner.h"
#include "plan/validator.h"

namespace megadecode {
namespace {

// The small MoE model with 40 experts (router row blocks 0..2, the last one partial), three
// sequences on 4 SMs, three tiles per SM where an op has the row blocks.
ModelConfig fixture_config() {
  ModelConfig c = test::small_moe_config();
  c.n_experts = 40;
  return c;
}

struct Fixture {
  ModelConfig config = fixture_config();
  test::TestWeights weights = test::random_weights(config, Dtype::kBF16, 7);
  std::vector<std::vector<int32_t>> tables{{0, 1}, {2}, {3, 4, 5}};
  BatchState batch{4, {{7, tables[0]}, {2, tables[1]}, {10, tables[2]}}};
  std::vector<int32_t> tokens{1, 2, 3};
  ref::KvStore kv{config, 4, 6};
  Plan plan;

  Fixture() {
    kv.fill(0.5f);
    Policy p = policy_by_name("default");
    p.tiles_per_sm = 3;
    PlanOptions o;
    o.n_sms = 4;
    o.sample = false;
    plan = make_plan(config, batch, p, o);
    validate_plan(plan);
  }

  std::string run_error(const emu::EmulatorOptions& options, emu::StepOutput* result = nullptr) {
    emu::StepInput in;
    in.tokens = tokens;
    in.batch = &batch;
    emu::StepOutput out;
    try {
      emu::Emulator(config, weights.weights, kv).run(plan, in, options, result ? *result : out);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  // The tile of `op` at `layer` with the highest rows, moved one row block down: its last row
  // block is computed by nobody (the tile below computes the one it takes).
  int drop_last_row_block(Op op, int layer) {
    int last = -1;
    for (int i : test::tasks_of(plan, op, layer))
      if (last < 0 || plan.tasks[i].arg[0] > plan.tasks[last].arg[0]) last = i;
    --plan.tasks[last].arg[0];
    --plan.tasks[last].arg[1];
    return plan.tasks[last].arg[1];  // the row block left out
  }
};

emu::EmulatorOptions sequential() {
  emu::EmulatorOptions o;
  o.sequential = true;
  return o;
}

TEST(EmulatorErrors, ValidPlanRuns) {
  Fixture f;
  EXPECT_EQ(f.run_error({}), "");
  EXPECT_EQ(f.run_error(sequential()), "");
}

TEST(EmulatorErrors, UnsatisfiableWaitTimesOutNamingEverything) {
  Fixture f;
  const int t = test::find_task(f.plan, Op::kOProj, 1);
  ASSERT_GE(t, 0);
  const Wait w = f.plan.tasks[t].wait[0];
  f.plan.tasks[t].wait[0].target += 1;
  emu::EmulatorOptions o;
  o.timeout_s = 0.2;
  const auto start = std::chrono::steady_clock::now();
  const std::string e = f.run_error(o);
  std::printf("%s\n", e.c_str());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << "the step hung";
  EXPECT_NE(e.find("timed out"), std::string::npos) << e;
  EXPECT_NE(e.find(cat("SM ", f.plan.sm_of(t), ", ", describe_task(f.plan, t))), std::string::npos) << e;
  EXPECT_NE(e.find(counter_name(f.plan, w.counter)), std::string::npos) << e;
  EXPECT_NE(e.find(cat(">= ", w.target + 1, " (value ", w.target, ")")), std::string::npos) << e;

  const std::string e2 = f.run_error(sequential());
  EXPECT_NE(e2.find("sequential run"), std::string::npos) << e2;
  EXPECT_NE(e2.find(describe_task(f.plan, t)), std::string::npos) << e2;
}

TEST(EmulatorErrors, ItemWaitTimeoutNamesTheItem) {
  Fixture f;
  // QKV tiles of group 1 in layer 0 stop arriving: attention items of group 1 can never start.
  const int group_rbs = f.plan.params.shape.qkv_group_rows / 16;
  int silenced = 0;
  for (Task& t : f.plan.tasks)
    if (t.op == static_cast<uint8_t>(Op::kQkv) && t.layer == 0 && t.arg[0] >= group_rbs) {
      t.n_arrives = 0;
      ++silenced;
    }
  ASSERT_GT(silenced, 0);
  emu::EmulatorOptions o;
  o.timeout_s = 0.2;
  const std::string e = f.run_error(o);
  EXPECT_NE(e.find("timed out"), std::string::npos) << e;
  EXPECT_NE(e.find("qkv_done[L0,g1]"), std::string::npos) << e;
  EXPECT_NE(e.find("L0 attn item"), std::string::npos) << e;
}

TEST(EmulatorErrors, AttentionItemRunTwiceTripsItsSplitCounter) {
  for (bool threaded : {false, true}) {
    Fixture f;
    // One split per sequence (contexts below the 256-token split): item 1's task runs item 0 again.
    const std::vector<int> attn = test::tasks_of(f.plan, Op::kAttn, 2);
    ASSERT_EQ(f.plan.attn_items[0].n_splits, 1);
    int twice = -1;
    for (int i : attn)
      if (f.plan.tasks[i].arg[0] == 1) twice = i;
    ASSERT_GE(twice, 0);
    f.plan.tasks[twice].arg[0] = 0;
    emu::EmulatorOptions o = threaded ? emu::EmulatorOptions{} : sequential();
    o.timeout_s = 5;
    const std::string e = f.run_error(o);
    EXPECT_NE(e.find("attention item 0: split counter of seq 0 g0 passed its 1 splits"), std::string::npos) << e;
    EXPECT_NE(e.find("L2 attn item 0"), std::string::npos) << e;
  }
}

TEST(EmulatorErrors, ExtraArrivalIsCaughtAfterTheStep) {
  Fixture f;
  // On the LM head's counter, which nothing in this step waits on (an extra arrival on a counter
  // that is waited on may instead let its consumers start early: see the test below).
  const int t = test::find_task(f.plan, Op::kLmHead, -1);
  Task& task = f.plan.tasks[t];
  task.arrive[task.n_arrives++] = {task.arrive[0].counter, 1};
  const std::string e = f.run_error({});
  EXPECT_NE(e.find("after the step"), std::string::npos) << e;
  EXPECT_NE(e.find(cat(counter_name(f.plan, task.arrive[0].counter), " is ", f.plan.counters[task.arrive[0].counter].total + 1,
                       ", the plan expects ", f.plan.counters[task.arrive[0].counter].total)),
            std::string::npos)
      << e;
}

// Rows of qkv, h, the router logits or x that no tile writes stay NaN and reach the routing, which
// every expert share derives from finite logits only. Layer 0 reads buffers poisoned at the start
// of the step; later layers are caught in sequential runs, which re-poison before each layer (a
// threaded run would read the previous layer's rows and differ from the sequential run instead).
TEST(EmulatorErrors, UncomputedRowsReachingTheRoutingAreAnError) {
  for (int layer : {0, 1})
    for (Op op : {Op::kQkv, Op::kOProj, Op::kRouter, Op::kExpertDown}) {
      SCOPED_TRACE(cat("L", layer, " ", op_name(op)));
      Fixture f;
      int routed_layer = layer;
      if (op == Op::kExpertDown) {
        // Share 3 of 4 takes the down row block of share 3 of 5 (row block 2): row block 3 of x is
        // left out, which the next layer's QKV prologue reads.
        f.plan.tasks[test::find_task(f.plan, op, layer, 3)].arg[2] = 5;
        routed_layer = layer + 1;
      } else {
        f.drop_last_row_block(op, layer);
      }
      std::vector<emu::EmulatorOptions> modes = {sequential()};
      if (layer == 0) modes.push_back({});
      for (const emu::EmulatorOptions& o : modes) {
        const std::string e = f.run_error(o);
        EXPECT_NE(e.find("is not finite (router tiles not run: missing dependency?)"), std::string::npos) << e;
        EXPECT_NE(e.find(cat("L", routed_layer, " expert_")), std::string::npos) << "does not name the share: " << e;
      }
      emu::EmulatorOptions quiet = sequential();
      quiet.poison = false;  // the same plan without the poison computes silently on stale rows
      EXPECT_EQ(f.run_error(quiet), "");
    }
}

// LM-head rows no tile computes are NaN in the step's logits; every other logit is the valid plan's.
TEST(EmulatorErrors, UncomputedLogitsArePoisoned) {
  Fixture valid;
  emu::StepOutput want;
  ASSERT_EQ(valid.run_error({}, &want), "");
  Fixture f;
  const int rb = f.drop_last_row_block(Op::kLmHead, -1);
  emu::StepOutput got;
  ASSERT_EQ(f.run_error({}, &got), "");
  const int V = f.config.vocab_size;
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) {
    const int row = static_cast<int>(i % V);
    if (row >= rb * 16 && row < rb * 16 + 16) {
      ASSERT_TRUE(std::isnan(got.logits[i])) << "logit " << row << " was not computed but is " << got.logits[i];
    } else {
      ASSERT_EQ(std::memcmp(&got.logits[i], &want.logits[i], 4), 0) << "logit " << row;
    }
  }
}

TEST(EmulatorErrors, BadInputsAreRejected) {
  Fixture f;
  f.tokens[1] = f.config.vocab_size;
  EXPECT_NE(f.run_error({}).find("outside the vocabulary"), std::string::npos);
  f.tokens.pop_back();
  EXPECT_NE(f.run_error({}).find("do not match"), std::string::npos);
  Fixture g;
  g.plan.params.shape.hidden = 32;
  EXPECT_NE(g.run_error({}).find("another model shape"), std::string::npos);
  Fixture h;
  h.plan.params.shape.kv_block_size = 16;
  EXPECT_NE(h.run_error({}).find("plan for KV blocks of 16 tokens, the store has 4"), std::string::npos);
  // A plan that samples needs a sampler.
  Fixture s;
  PlanOptions o;
  o.n_sms = 4;
  s.plan = make_plan(s.config, s.batch, policy_by_name("default"), o);
  EXPECT_NE(s.run_error({}).find("has no sampler"), std::string::npos);
}

}  // namespace
}  // namespace megadecode
