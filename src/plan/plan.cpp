// Names for plans' tasks, counters and queues, used in validator errors, emulator timeouts and
// statistics.
#include "plan/plan.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode {

const char* counter_kind_name(CounterKind kind) {
  switch (kind) {
    case CounterKind::kNormDone: return "norm_done";
    case CounterKind::kQkvDone: return "qkv_done";
    case CounterKind::kAttnSplit: return "attn_split";
    case CounterKind::kAttnDone: return "attn_done";
    case CounterKind::kOprojDone: return "oproj_done";
    case CounterKind::kMoeNormDone: return "moe_norm_done";
    case CounterKind::kRouterDone: return "router_done";
    case CounterKind::kDispatchDone: return "dispatch_done";
    case CounterKind::kUpDone: return "up_done";
    case CounterKind::kDownDone: return "down_done";
    case CounterKind::kAttnHead: return "attn_head";
    case CounterKind::kUpHead: return "up_head";
    case CounterKind::kDownHead: return "down_head";
    case CounterKind::kFinalNormDone: return "final_norm_done";
    case CounterKind::kLmHeadDone: return "lm_head_done";
    case CounterKind::kSampleDone: return "sample_done";
    case CounterKind::kWaveDone: return "wave_done";
    case CounterKind::kUnused: return "unused";
  }
  return "?";
}

int Plan::sm_of(int task) const {
  auto it = std::upper_bound(list_begin.begin(), list_begin.end(), task);
  return static_cast<int>(it - list_begin.begin()) - 1;
}

std::string counter_name(const Plan& plan, int32_t counter) {
  if (counter < 0 || counter >= static_cast<int32_t>(plan.counters.size())) return cat("counter ", counter, " (out of range)");
  const CounterInfo& c = plan.counters[counter];
  std::string s = cat("counter ", counter, " ", counter_kind_name(c.kind));
  const int g = plan.params.shape.n_kv_heads;
  switch (c.kind) {
    case CounterKind::kQkvDone:
    case CounterKind::kAttnDone: return cat(s, "[L", c.layer, ",g", c.index, "]");
    case CounterKind::kAttnSplit: return cat(s, "[L", c.layer, ",seq", c.index / g, ",g", c.index % g, "]");
    case CounterKind::kUpDone: return cat(s, "[L", c.layer, ",e", c.index, "]");
    case CounterKind::kWaveDone: return cat(s, "[wave ", c.index, "]");
    default: return c.layer >= 0 ? cat(s, "[L", c.layer, "]") : s;
  }
}

std::string describe_task(const Plan& plan, int task) {
  if (task < 0 || task >= static_cast<int>(plan.tasks.size())) return cat("task ", task, " (out of range)");
  const Task& t = plan.tasks[task];
  const int sm = plan.sm_of(task);
  std::string where = cat("task ", task, " (SM ", sm, " #", task - plan.list_begin[sm], ": ");
  if (t.layer >= 0) where += cat("L", t.layer, " ");
  const Op op = static_cast<Op>(t.op);
  if (t.op >= kNumOps) return cat(where, "bad opcode ", static_cast<int>(t.op), ")");
  where += op_name(op);
  switch (op) {
    case Op::kAttnNorm:
    case Op::kMoeNorm:
    case Op::kFinalNorm:
    case Op::kSample: return cat(where, " tokens ", t.arg[0], "..", t.arg[1], ")");
    case Op::kQkv:
    case Op::kOProj: return cat(where, " g", t.arg[0], " rows ", t.arg[1], "..", t.arg[2], ")");
    case Op::kRouter: return cat(where, " experts ", t.arg[0], "..", t.arg[1], ")");
    case Op::kLmHead: return cat(where, " rows ", t.arg[0], "..", t.arg[1], ")");
    default: return where + ")";
  }
}

std::string describe_queue(const Plan& plan, int queue) {
  if (queue < 0 || queue >= static_cast<int>(plan.queues.size())) return cat("queue ", queue, " (out of range)");
  const QueueInfo& q = plan.queues[queue];
  return cat(op_name(q.op), " queue of L", q.layer);
}

}  // namespace megadecode
