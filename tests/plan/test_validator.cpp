// Tests for the plan validator: deliberately broken plans (cycle, unreachable target, wait with no
// producer, self-deadlock, deadlock through list order, same-wave wait, over-full and
// under-sized queues, unsafe buffer reuse, malformed records) are rejected with a message naming the task or queue.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "core/check.h"
#include "plan/planner.h"
#include "plan/validator.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

struct Fixture {
  std::vector<std::vector<int32_t>> tables;
  Plan plan;
};

// A valid plan of the tiny preset, 2 SMs, no LM head (so the final counters are free to misuse).
Fixture make_fixture(int n_sms = 2, const std::string& policy = "default") {
  Fixture f;
  const ModelConfig c = preset_config("tiny");
  Policy p = policy_by_name(policy);
  p.tile_weight_bytes = 2048;  // several QKV tiles per group
  p.attn_min_split_tokens = 16;
  BatchState b{16, {}};
  f.tables = {{0, 1, 2}, {3}, {4, 5}};
  for (int i = 0; i < 3; ++i) b.seqs.push_back({static_cast<int>(f.tables[i].size()) * 16 - i, f.tables[i]});
  PlanOptions o;
  o.n_sms = n_sms;
  o.lm_head = o.sample = false;
  f.plan = make_plan(c, b, p, o);
  validate_plan(f.plan);
  return f;
}

std::string validation_error(const Plan& plan) {
  try {
    validate_plan(plan);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The i-th task (in list order) of `op` at `layer` on SM `sm` (-1: any SM).
int find_task(const Plan& plan, Op op, int layer, int sm, int nth = 0) {
  const int begin = sm < 0 ? 0 : plan.list_begin[sm], end = sm < 0 ? plan.list_begin.back() : plan.list_begin[sm + 1];
  for (int i = begin; i < end; ++i)
    if (plan.tasks[i].op == static_cast<uint8_t>(op) && plan.tasks[i].layer == layer && nth-- == 0) return i;
  ADD_FAILURE() << "no " << op_name(op) << " task";
  return -1;
}

void expect_error(const Plan& plan, const std::string& what, const std::string& names) {
  const std::string e = validation_error(plan);
  if (std::getenv("SHOW_ERRORS")) std::printf("%s\n", e.c_str());
  EXPECT_NE(e.find(what), std::string::npos) << "error: " << e;
  EXPECT_NE(e.find(names), std::string::npos) << "error does not name \"" << names << "\": " << e;
}

TEST(Validator, RejectsDependencyCycle) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // A QKV tile of layer 0 waits on the O-proj of layer 0, which (through attention) waits on it.
  const int qkv = find_task(p, Op::kQkv, 0, 0);
  const int oproj = find_task(p, Op::kOProj, 0, 1);
  p.tasks[qkv].wait[p.tasks[qkv].n_waits++] = {p.tasks[oproj].arrive[0].counter, 1};
  expect_error(p, "dependency cycle", describe_task(p, qkv));
}

TEST(Validator, RejectsUnreachableTarget) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int oproj = find_task(p, Op::kOProj, 1, 1);
  p.tasks[oproj].wait[0].target += 1;  // attn_done counts sequences: one more than the batch
  expect_error(p, "unreachable", describe_task(p, oproj));
  p.tasks[oproj].wait[0].target = 0;
  expect_error(p, "< 1", describe_task(p, oproj));
}

TEST(Validator, RejectsWaitWithoutProducer) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int router = find_task(p, Op::kRouter, 0, -1);
  p.tasks[router].wait[p.tasks[router].n_waits++] = {p.params.counters.sample_done, 1};
  expect_error(p, "that no task or item arrives on", describe_task(p, router));
}

TEST(Validator, RejectsSelfDeadlock) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // SM 0 holds group 0's QKV tiles before group 1's (group-major order); make its first group-0
  // tile wait for group 1, whose tiles include ones later in SM 0's own list.
  const int first = find_task(p, Op::kQkv, 0, 0);
  ASSERT_EQ(p.tasks[first].arg[0], 0);
  const int tiles = p.params.shape.qkv_tiles_per_group;
  p.tasks[first].wait[p.tasks[first].n_waits++] = {layer_counter(p.params.counters, 0, p.params.counters.qkv_done + 1), tiles};
  expect_error(p, "self-deadlock", describe_task(p, first));
}

TEST(Validator, RejectsDeadlockThroughListOrder) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // X (SM0) waits on Y (SM1, second QKV tile); W (SM1, first QKV tile, before Y) waits on Z
  // (SM0, after X). No dependency cycle, but each SM blocks the other.
  const int x = find_task(p, Op::kQkv, 0, 0, 0), z = find_task(p, Op::kQkv, 0, 0, 1);
  const int w = find_task(p, Op::kQkv, 0, 1, 0), y = find_task(p, Op::kQkv, 0, 1, 1);
  const int32_t c1 = p.params.counters.final_norm_done, c2 = p.params.counters.lm_head_done;
  p.tasks[y].arrive[p.tasks[y].n_arrives++] = {c1, 1};
  p.tasks[z].arrive[p.tasks[z].n_arrives++] = {c2, 1};
  p.counters[c1].total = p.counters[c2].total = 1;
  p.tasks[x].wait[p.tasks[x].n_waits++] = {c1, 1};
  p.tasks[w].wait[p.tasks[w].n_waits++] = {c2, 1};
  const std::string e = validation_error(p);
  if (std::getenv("SHOW_ERRORS")) std::printf("%s\n", e.c_str());
  EXPECT_NE(e.find("deadlock through list order"), std::string::npos) << e;
  EXPECT_NE(e.find(describe_task(p, x)), std::string::npos) << e;
  EXPECT_NE(e.find(describe_task(p, w)), std::string::npos) << e;
}

TEST(Validator, RejectsWaitInsideTheSameWave) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int x = find_task(p, Op::kQkv, 0, 0, 0), y = find_task(p, Op::kQkv, 0, 1, 1);
  const int32_t c1 = p.params.counters.final_norm_done;
  p.tasks[y].arrive[p.tasks[y].n_arrives++] = {c1, 1};
  p.counters[c1].total = 1;
  p.tasks[x].wait[p.tasks[x].n_waits++] = {c1, 1};
  expect_error(p, "not an earlier one", describe_task(p, x));
}

TEST(Validator, RejectsOverfullAndUndersizedQueues) {
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    // One more attention item than the capacity the buffers were sized for.
    for (QueueInfo& q : p.queues)
      if (q.op == Op::kAttn && q.layer == 1) q.capacity = q.n_items - 1;
    expect_error(p, "over-full", "attn queue of L1");
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    for (QueueInfo& q : p.queues)
      if (q.op == Op::kExpertDown && q.layer == 2) q.capacity = q.worst_case - 1;
    expect_error(p, "at worst but holds only", "expert_down queue of L2");
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    p.params.buffers.up_items.bytes -= 4;
    expect_error(p, "smaller than the queue capacities", "queue");
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    std::swap(p.attn_items[0], p.attn_items[1]);
    expect_error(p, "does not continue its sequence's splits", "attn queue of L0");
  }
}

TEST(Validator, RejectsUnsafeBufferReuse) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // Layer 1's norms no longer wait for layer 0's experts: they would overwrite x while layer 0 runs.
  for (Task& t : p.tasks)
    if (t.op == static_cast<uint8_t>(Op::kAttnNorm) && t.layer == 1) t.n_waits = 0;
  expect_error(p, "unsafe buffer reuse", "L1 attn_norm");
}

TEST(Validator, RejectsQueueWithoutDrain) {
  Fixture f = make_fixture(1);
  Plan& p = f.plan;
  const int drain = find_task(p, Op::kExpertUp, 1, 0);
  p.tasks[drain].op = static_cast<uint8_t>(Op::kExpertDown);
  p.task_wave[drain] = p.task_wave[drain + 1];  // now it is a second drain of the down queue
  expect_error(p, "has no drain task", "expert_up queue of L1");
}

TEST(Validator, RejectsMalformedRecords) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int t = find_task(p, Op::kRouter, 0, -1);
  Task saved = p.tasks[t];
  p.tasks[t].op = 200;
  expect_error(p, "bad opcode", "task " + std::to_string(t));
  p.tasks[t] = saved;
  p.tasks[t].wait[0].counter = p.params.counters.n_counters;
  expect_error(p, "outside the", describe_task(p, t));
  p.tasks[t] = saved;
  p.tasks[t].n_waits = kMaxWaits + 1;
  expect_error(p, "too many waits", describe_task(p, t));
}

TEST(Validator, AcceptsEveryPolicyOnOneSm) {
  for (const std::string& name : policy_names()) EXPECT_NO_THROW(make_fixture(1, name)) << name;
}

}  // namespace
}  // namespace megadecode
