// Tests for the plan validator: deliberately broken v2 plans are rejected with a message naming the
// task (or the attention item, row block or share nobody runs): a dependency cycle, unsatisfiable
// waits, self-deadlock, deadlock through list order, a wait inside its own wave, row blocks covered
// twice or not at all, QKV tiles outside their KV group, attention items run twice or never, missing
// or duplicated MoE shares, dynamic arrivals that do not name their tasks, unsafe buffer reuse
// across layers, malformed records. Every policy's plans are accepted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "core/check.h"
#include "plan/planner.h"
#include "plan/validator.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

using test::validation_error;

using test::find_task;

struct Fixture {
  std::vector<std::vector<int32_t>> tables;
  Plan plan;
};

// A valid plan of the tiny preset (3 layers, 2 KV groups of 12 QKV row blocks, 8 O-proj row blocks,
// one router row block), 2 SMs, three tiles per SM: QKV tiles [0,4) [4,8) [8,12) of group 0 and
// [12,16) [16,20) [20,24) of group 1, dealt SM 0, 1, 0, 1, 0, 1 in layer 0 (later layers start
// where the previous wave's dealing ended). Three sequences of contexts 48, 13 and 28 in 16-token
// splits: 3 + 1 + 1 attention items per group. No LM head unless asked (so the final counters are
// free to misuse).
Fixture make_fixture(int n_sms = 2, const std::string& policy = "default", bool lm_head = false) {
  Fixture f;
  const ModelConfig c = preset_config("tiny");
  Policy p = policy_by_name(policy);
  p.tiles_per_sm = 3;
  p.attn_min_split_tokens = 16;
  BatchState b{16, {}};
  f.tables = {{0, 1, 2}, {3}, {4, 5}};
  for (int i = 0; i < 3; ++i) b.seqs.push_back({static_cast<int>(f.tables[i].size()) * 16 - i * 2 - (i == 1), f.tables[i]});
  PlanOptions o;
  o.n_sms = n_sms;
  o.lm_head = lm_head;
  o.sample = false;
  f.plan = make_plan(c, b, p, o);
  validate_plan(f.plan);
  return f;
}

// The task of `op` at `layer` whose first argument (row block, item, share) is `arg0`.
int task_with_arg(const Plan& plan, Op op, int layer, int arg0) {
  for (int i : test::tasks_of(plan, op, layer))
    if (plan.tasks[i].arg[0] == arg0) return i;
  ADD_FAILURE() << "no " << op_name(op) << " task of L" << layer << " with arg0 " << arg0;
  return -1;
}

void expect_error(const Plan& plan, const std::string& what, const std::string& names) {
  const std::string e = validation_error(plan);
  if (std::getenv("SHOW_ERRORS")) std::printf("%s\n", e.c_str());
  EXPECT_NE(e.find(what), std::string::npos) << "error: " << e;
  EXPECT_NE(e.find(names), std::string::npos) << "error does not name \"" << names << "\": " << e;
}

TEST(Validator, FixtureIsWhatItsCommentSays) {
  const Plan& p = make_fixture().plan;
  ASSERT_EQ(p.params.shape.n_qkv_tasks, 6);
  ASSERT_EQ(p.params.shape.n_attn_items, 10);
  const int x = find_task(p, Op::kQkv, 0, 0, 0), z = find_task(p, Op::kQkv, 0, 0, 1), last = find_task(p, Op::kQkv, 0, 0, 2);
  EXPECT_EQ(p.tasks[x].arg[0], 0);
  EXPECT_EQ(p.tasks[z].arg[0], 8);
  EXPECT_EQ(p.tasks[last].arg[0], 16);
  EXPECT_EQ(p.tasks[find_task(p, Op::kQkv, 0, 1, 1)].arg[0], 12);
}

TEST(Validator, RejectsDependencyCycle) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // A QKV tile of layer 0 waits on the layer's O-proj, which (through attention) waits on it.
  const int qkv = find_task(p, Op::kQkv, 0, 0);
  const int oproj = find_task(p, Op::kOProj, 0, 1);
  p.tasks[qkv].wait[p.tasks[qkv].n_waits++] = {p.tasks[oproj].arrive[0].counter, 1};
  expect_error(p, "dependency cycle", describe_task(p, qkv));
}

TEST(Validator, RejectsUnsatisfiableWaits) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int oproj = find_task(p, Op::kOProj, 1, 1);
  p.tasks[oproj].wait[0].target += 1;  // attn_done counts (sequence, group) merges: one more than there are
  expect_error(p, "unreachable", describe_task(p, oproj));
  p.tasks[oproj].wait[0].target = 0;
  expect_error(p, "< 1", describe_task(p, oproj));
  // More than the plan's total for the counter, though its producers could arrive that often.
  Fixture g = make_fixture();
  Plan& q = g.plan;
  const int first = find_task(q, Op::kOProj, 1);
  q.counters[q.tasks[first].wait[0].counter].total -= 1;
  expect_error(q, "the plan expects it to reach only 5", describe_task(q, first));
  // A static counter planned off what its producers arrive.
  Fixture h = make_fixture();
  const int32_t up_done = layer_counter(h.plan.params.counters, 0, h.plan.params.counters.up_done);
  h.plan.counters[up_done].total += 1;
  expect_error(h.plan, "is planned to reach 3 but its producers arrive 2..2 times", counter_name(h.plan, up_done));
}

TEST(Validator, RejectsWaitWithoutProducer) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int router = find_task(p, Op::kRouter, 0);
  p.tasks[router].wait[p.tasks[router].n_waits++] = {p.params.counters.sample_done, 1};
  expect_error(p, "that no task or item arrives on", describe_task(p, router));
}

TEST(Validator, RejectsSelfDeadlock) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // SM 0's first QKV tile (group 0) waits for all of group 1, whose tile [16,20) comes later in SM 0's
  // own list.
  const int first = find_task(p, Op::kQkv, 0, 0);
  p.tasks[first].wait[p.tasks[first].n_waits++] = {layer_counter(p.params.counters, 0, p.params.counters.qkv_done + 1), 3};
  expect_error(p, "self-deadlock", describe_task(p, first));
  EXPECT_NE(validation_error(p).find(describe_task(p, find_task(p, Op::kQkv, 0, 0, 2))), std::string::npos)
      << "does not name the later task it needs";
}

TEST(Validator, RejectsDeadlockThroughListOrder) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  // X (SM0 #0) waits on Y (SM1 #1); W (SM1 #0, before Y) waits on Z (SM0 #1, after X). No
  // dependency cycle, but each SM blocks the other. The free final counters carry the waits.
  const int x = find_task(p, Op::kQkv, 0, 0, 0), z = find_task(p, Op::kQkv, 0, 0, 1);
  const int w = find_task(p, Op::kQkv, 0, 1, 0), y = find_task(p, Op::kQkv, 0, 1, 1);
  const int32_t c1 = p.params.counters.lm_head_done, c2 = p.params.counters.sample_done;
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
  const int32_t c1 = p.params.counters.lm_head_done;
  p.tasks[y].arrive[p.tasks[y].n_arrives++] = {c1, 1};
  p.counters[c1].total = 1;
  p.tasks[x].wait[p.tasks[x].n_waits++] = {c1, 1};
  expect_error(p, "not an earlier one", describe_task(p, x));
}

TEST(Validator, RejectsRowBlocksCoveredTwiceOrNotAtAll) {
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int a = task_with_arg(p, Op::kQkv, 1, 0), b = task_with_arg(p, Op::kQkv, 1, 4);  // [0,4) and [4,8)
    p.tasks[b].arg[0] = 3;
    expect_error(p, "L1 qkv row block 3 runs 2 times", describe_task(p, a));
    expect_error(p, "L1 qkv row block 3 runs 2 times", describe_task(p, b));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int oproj = task_with_arg(p, Op::kOProj, 2, 2);  // [2,4) of the 8 row blocks in 6 tiles
    ASSERT_EQ(p.tasks[oproj].arg[1], 4);
    const int rb = p.tasks[oproj].arg[1] - 1;
    p.tasks[oproj].arg[1] -= 1;
    expect_error(p, cat("L2 o_proj row block ", rb, " runs 0 times: no tile covers it"), describe_task(p, oproj));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int router = find_task(p, Op::kRouter, 0);
    p.tasks[router].arg[1] = 2;  // 16 experts: one row block
    expect_error(p, "row blocks outside the matrix's 1", describe_task(p, router));
  }
}

TEST(Validator, RejectsQkvTilesOutsideTheirGroup) {
  {
    // [8,12) of group 0 grows into group 1's first row block, and group 1's first tile shrinks:
    // every row block once, three tiles per group, but the group-1 row block is announced on g0.
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int a = find_task(p, Op::kQkv, 0, 0, 1), b = find_task(p, Op::kQkv, 0, 1, 1);
    ASSERT_EQ(p.tasks[a].arg[1], 12);
    ASSERT_EQ(p.tasks[b].arg[0], 12);
    p.tasks[a].arg[1] = p.tasks[b].arg[0] = 13;
    expect_error(p, "rows of KV groups 0 and 1 in one QKV tile", describe_task(p, a));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int a = find_task(p, Op::kQkv, 0, 0, 0);  // group 0, arrives on qkv_done[L0,g1] instead
    p.tasks[a].arrive[0].counter += 1;
    expect_error(p, "but arrives on " + counter_name(p, p.tasks[a].arrive[0].counter), describe_task(p, a));
  }
}

TEST(Validator, RejectsAttentionItemsRunTwiceOrNever) {
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int t = task_with_arg(p, Op::kAttn, 1, 1), other = task_with_arg(p, Op::kAttn, 1, 0);
    p.tasks[t].arg[0] = 0;  // the task of item 1 runs item 0
    expect_error(p, "attention item 0 (seq 0, g0, split 0) of L1 runs 2 times", describe_task(p, t));
    expect_error(p, "runs 2 times", describe_task(p, other));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    p.tasks[task_with_arg(p, Op::kAttn, 2, 0)].arg[0] = 1;  // item 0 of L2 is never run
    expect_error(p, "attention item 0 (seq 0, g0, split 0) of L2 runs 0 times", "no task of the layer names it");
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int t = find_task(p, Op::kAttn, 0);
    p.tasks[t].arg[0] = p.params.shape.n_attn_items;
    expect_error(p, "names no attention item", describe_task(p, t));
  }
}

TEST(Validator, RejectsMissingOrDuplicatedMoeShares) {
  for (Op op : {Op::kExpertUp, Op::kExpertDown}) {
    SCOPED_TRACE(op_name(op));
    {
      Fixture f = make_fixture();
      Plan& p = f.plan;
      const int b = find_task(p, op, 1, 1);
      ASSERT_EQ(p.tasks[b].arg[0], 1);
      ASSERT_EQ(p.tasks[b].arg[2], 2);
      p.tasks[b].arg[0] = 0;  // SM 1 runs units 0..2: unit 0 is SM 0's too
      expect_error(p, cat("L1 ", op_name(op), " units 0..1 of two shares"), describe_task(p, b));
    }
    {
      Fixture f = make_fixture(3);
      Plan& p = f.plan;
      for (int sm = 0; sm < 3; ++sm) {  // every share one unit later, of 4: unit 0 of L2 nobody's
        Task& t = p.tasks[find_task(p, op, 2, sm)];
        ++t.arg[0];
        ++t.arg[1];
        t.arg[2] = 4;
      }
      expect_error(p, cat("L2 ", op_name(op), " units 0..1 of no share (before "),
                   describe_task(p, find_task(p, op, 2, 0)));
    }
    {
      Fixture f = make_fixture();
      Plan& p = f.plan;
      const int b = find_task(p, op, 0, 1);
      p.tasks[b].arg[2] = 3;
      expect_error(p, "other shares divide 2 units, not 3", describe_task(p, b));
      p.tasks[find_task(p, op, 0, 0)].arg[2] = 3;  // units 2..3 nobody's
      expect_error(p, cat("L0 ", op_name(op), " units 2..3 of no share (after "), describe_task(p, b));
      p.tasks[b].arg[0] = 3;
      expect_error(p, "bad share", describe_task(p, b));
    }
  }
}

TEST(Validator, RejectsDynamicArrivalsThatDoNotNameTheirTasks) {
  const int32_t done = [] {
    const Plan p = make_fixture().plan;
    return layer_counter(p.params.counters, 1, p.params.counters.attn_done);
  }();
  auto arrival_on = [](Plan& p, int32_t counter) -> DynamicArrival& {
    for (DynamicArrival& d : p.dynamic_arrivals)
      if (d.counter == counter) return d;
    ADD_FAILURE() << "no dynamic arrival on counter " << counter;
    return p.dynamic_arrivals.front();
  };
  {
    // attn_done[L1] without one of the layer's attention tasks: the graph would miss the O-proj's
    // dependency on it.
    Fixture f = make_fixture();
    Plan& p = f.plan;
    DynamicArrival& d = arrival_on(p, done);
    const int32_t dropped = d.tasks[3];
    d.tasks.erase(d.tasks.begin() + 3);
    expect_error(p, "leave out", describe_task(p, dropped));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int router = find_task(p, Op::kRouter, 1);
    arrival_on(p, done).tasks.push_back(router);
    expect_error(p, "which cannot make them", describe_task(p, router));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    arrival_on(p, done).max_amount += 1;  // would let a wait for one more merge pass
    expect_error(p, "add at most 6, declared 7", counter_name(p, done));
  }
  {
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int32_t split = layer_counter(p.params.counters, 0, p.params.counters.attn_split);  // seq 0, g0
    const auto it = std::find_if(p.dynamic_arrivals.begin(), p.dynamic_arrivals.end(),
                                 [&](const DynamicArrival& d) { return d.counter == split; });
    ASSERT_NE(it, p.dynamic_arrivals.end());
    p.dynamic_arrivals.erase(it);
    expect_error(p, "no dynamic arrival declares it", describe_task(p, find_task(p, Op::kAttn, 0)));
    p.dynamic_arrivals.push_back(p.dynamic_arrivals.back());
    expect_error(p, "are declared twice", "dynamic arrivals on");
  }
}

TEST(Validator, RejectsUnsafeBufferReuse) {
  {
    // Layer 1's QKV tiles no longer wait for layer 0's experts: they would overwrite qkv (and read x)
    // while layer 0 runs.
    Fixture f = make_fixture();
    Plan& p = f.plan;
    for (Task& t : p.tasks)
      if (t.op == static_cast<uint8_t>(Op::kQkv) && t.layer == 1) t.n_waits = 0;
    expect_error(p, "unsafe buffer reuse", "L1 qkv");
    EXPECT_NE(validation_error(p).find(": L0 "), std::string::npos) << "does not name the layer-0 task: " << validation_error(p);
  }
  {
    // One QKV tile of layer 2 waits on layer 1's up shares only: ordered after most of layer 1,
    // but not after its down shares.
    Fixture f = make_fixture();
    Plan& p = f.plan;
    for (Task& t : p.tasks)
      if (t.op == static_cast<uint8_t>(Op::kQkv) && t.layer == 2) {
        t.wait[0] = {layer_counter(p.params.counters, 1, p.params.counters.up_done), 2};
      }
    expect_error(p, "unsafe buffer reuse", "L1 expert_down");
  }
  {
    // The LM head reads x: it must come after the last layer's down shares.
    Fixture f = make_fixture(2, "default", true);
    Plan& p = f.plan;
    for (Task& t : p.tasks)
      if (t.op == static_cast<uint8_t>(Op::kLmHead)) t.wait[0] = {layer_counter(p.params.counters, 2, p.params.counters.up_done), 2};
    expect_error(p, "unsafe buffer reuse", "lm_head");
  }
  {
    // A funnel wave whose tasks wait differently cannot be checked from one of them.
    Fixture f = make_fixture();
    Plan& p = f.plan;
    const int t = find_task(p, Op::kQkv, 1, 1, 1);
    p.tasks[t].wait[p.tasks[t].n_waits++] = {layer_counter(p.params.counters, 0, p.params.counters.router_done), 1};
    expect_error(p, "does not wait like the rest of its wave", describe_task(p, t));
  }
}

TEST(Validator, RejectsMalformedRecords) {
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int t = find_task(p, Op::kRouter, 0);
  const Task saved = p.tasks[t];
  p.tasks[t].op = 200;
  expect_error(p, "bad opcode", "task " + std::to_string(t));
  p.tasks[t] = saved;
  p.tasks[t].wait[0].counter = p.params.counters.n_counters;
  expect_error(p, "outside the", describe_task(p, t));
  p.tasks[t] = saved;
  p.tasks[t].n_waits = kMaxWaits + 1;
  expect_error(p, "too many waits", describe_task(p, t));
  p.tasks[t] = saved;
  p.tasks[t].arrive[0].amount = 0;
  expect_error(p, "arrival amount 0", describe_task(p, t));
  p.tasks[t] = saved;
  p.tasks[t].layer = 3;
  expect_error(p, "layer out of range", "task " + std::to_string(t));
  p.tasks[t] = saved;
  p.task_wave[t] += 1;
  expect_error(p, "not in the wave", describe_task(p, t));
  p.task_wave[t] -= 1;
  ASSERT_EQ(validation_error(p), "");
  // Attention items: out of order, overlapping, or a (sequence, group) short of its splits.
  std::swap(p.attn_items[0], p.attn_items[1]);
  expect_error(p, "does not continue its sequence's splits", "attention item 0");
  std::swap(p.attn_items[0], p.attn_items[1]);
  p.attn_items[1].pos_begin -= 1;
  expect_error(p, "does not continue its sequence's splits", "attention item 1");
  p.attn_items[1].pos_begin += 1;
  p.attn_items[2].pos_end = p.attn_items[2].pos_begin;
  expect_error(p, "is malformed", "attention item 2");
  p.attn_items[2].n_splits = 4;
  p.attn_items[2].pos_end = p.attn_items[2].pos_begin + 16;
  expect_error(p, "has 3 of its", "seq 0 g0");
}

TEST(Validator, RejectsAFirstRoutedTaskWhoseLastWaitIsNotTheRouter) {
  // The megakernel's loader reads the layer's logits after the last wait of the SM's first routed
  // task of the layer: without the router wait there, nothing orders the read after the router tiles.
  Fixture f = make_fixture();
  Plan& p = f.plan;
  const int up = task_with_arg(p, Op::kExpertUp, 1, 0);
  ASSERT_GE(up, 0);
  ASSERT_GE(p.tasks[up].n_waits, 2);
  --p.tasks[up].n_waits;  // its last wait: the router tiles'
  expect_error(p, "but its last wait does not imply", describe_task(p, up));
}

TEST(Validator, AcceptsEveryPolicy) {
  for (const std::string& name : policy_names())
    for (int n_sms : {1, 2, 5})
      for (bool lm_head : {false, true}) EXPECT_NO_THROW(make_fixture(n_sms, name, lm_head)) << name << " " << n_sms;
}

}  // namespace
}  // namespace megadecode
