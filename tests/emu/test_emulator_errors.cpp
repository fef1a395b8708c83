// The emulator's failure modes are Errors, never hangs or silent wrong answers: a wait that can
// never be satisfied times out naming SM, task, counter, value and target (threaded) or fails at
// once (sequential); an extra arrival is caught by the end-of-step counter check; an expert queue
// too small for the routing is an overflow error; bad inputs are rejected.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include "../plan/plan_test_util.h"
#include "../ref/ref_test_util.h"
#include "core/check.h"
#include "emu/emulator.h"
#include "plan/planner.h"
#include "plan/validator.h"

namespace megadecode {
namespace {

struct Fixture {
  ModelConfig config = test::small_moe_config();
  test::TestWeights weights = test::random_weights(config, Dtype::kBF16, 7);
  std::vector<std::vector<int32_t>> tables{{0, 1}, {2}, {3, 4, 5}};
  BatchState batch{4, {{7, tables[0]}, {2, tables[1]}, {10, tables[2]}}};
  std::vector<int32_t> tokens{1, 2, 3};
  ref::KvStore kv{config, 4, 6};
  Plan plan;

  Fixture() {
    kv.fill(0.5f);
    Policy p = policy_by_name("default");
    p.tile_weight_bytes = 1024;
    PlanOptions o;
    o.n_sms = 4;
    o.sample = false;
    plan = make_plan(config, batch, p, o);
    validate_plan(plan);
  }

  std::string run_error(const emu::EmulatorOptions& options) {
    emu::StepInput in;
    in.tokens = tokens;
    in.batch = &batch;
    emu::StepOutput out;
    try {
      emu::Emulator(config, weights.weights, kv).run(plan, in, options, out);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  int find(Op op, int layer) const {
    for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i)
      if (plan.tasks[i].op == static_cast<uint8_t>(op) && plan.tasks[i].layer == layer) return i;
    return -1;
  }
};

TEST(EmulatorErrors, ValidPlanRuns) {
  Fixture f;
  EXPECT_EQ(f.run_error({}), "");
}

TEST(EmulatorErrors, UnsatisfiableWaitTimesOutNamingEverything) {
  Fixture f;
  const int t = f.find(Op::kOProj, 1);
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
  EXPECT_NE(e.find(describe_task(f.plan, t)), std::string::npos) << e;
  EXPECT_NE(e.find(counter_name(f.plan, w.counter)), std::string::npos) << e;
  EXPECT_NE(e.find(cat(">= ", w.target + 1, " (value ", w.target, ")")), std::string::npos) << e;

  emu::EmulatorOptions seq;
  seq.sequential = true;
  const std::string e2 = f.run_error(seq);
  EXPECT_NE(e2.find("sequential run"), std::string::npos) << e2;
  EXPECT_NE(e2.find(describe_task(f.plan, t)), std::string::npos) << e2;
}

TEST(EmulatorErrors, ItemWaitTimeoutNamesTheItem) {
  Fixture f;
  // QKV tiles of group 1 in layer 0 stop arriving: attention items of group 1 can never start.
  for (Task& t : f.plan.tasks)
    if (t.op == static_cast<uint8_t>(Op::kQkv) && t.layer == 0 && t.arg[0] == 1) t.n_arrives = 0;
  emu::EmulatorOptions o;
  o.timeout_s = 0.2;
  const std::string e = f.run_error(o);
  EXPECT_NE(e.find("timed out"), std::string::npos) << e;
  EXPECT_NE(e.find("qkv_done[L0,g1]"), std::string::npos) << e;
  EXPECT_NE(e.find("item"), std::string::npos) << e;
}

TEST(EmulatorErrors, ExtraArrivalIsCaughtAfterTheStep) {
  Fixture f;
  const int t = f.find(Op::kRouter, 0);
  Task& task = f.plan.tasks[t];
  task.arrive[task.n_arrives++] = {task.arrive[0].counter, 1};
  const std::string e = f.run_error({});
  EXPECT_NE(e.find("after the step"), std::string::npos) << e;
  EXPECT_NE(e.find(counter_name(f.plan, task.arrive[0].counter)), std::string::npos) << e;
}

TEST(EmulatorErrors, ExpertQueueOverflowIsAnError) {
  Fixture f;
  f.plan.params.shape.up_capacity = f.plan.params.shape.up_blocks;  // room for one expert only
  const std::string e = f.run_error({});
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;
  EXPECT_NE(e.find("dispatch"), std::string::npos) << e;
}

TEST(EmulatorErrors, BadInputsAreRejected) {
  Fixture f;
  f.tokens[1] = f.config.vocab_size;
  EXPECT_NE(f.run_error({}).find("outside the vocabulary"), std::string::npos);
  f.tokens.pop_back();
  EXPECT_NE(f.run_error({}).find("do not match"), std::string::npos);
}

}  // namespace
}  // namespace megadecode
