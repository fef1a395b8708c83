// Names for plans' tasks and counters, used in validator errors, emulator timeouts and statistics.
#include "plan/plan.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode {

const char* counter_kind_name(CounterKind kind) {
  switch (kind) {
    case CounterKind::kQkvDone: return "qkv_done";
    case CounterKind::kAttnSplit: return "attn_split";
    case CounterKind::kAttnDone: return "attn_done";
    case CounterKind::kOprojDone: return "oproj_done";
    case CounterKind::kRouterDone: return "router_done";
    case CounterKind::kUpDone: return "up_done";
    case CounterKind::kDownDone: return "down_done";
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
    case CounterKind::kQkvDone: return cat(s, "[L", c.layer, ",g", c.index, "]");
    case CounterKind::kAttnSplit: return cat(s, "[L", c.layer, ",seq", c.index / g, ",g", c.index % g, "]");
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
    case Op::kSample: return cat(where, " tokens ", t.arg[0], "..", t.arg[1], ")");
    case Op::kQkv:
    case Op::kOProj:
    case Op::kRouter:
    case Op::kLmHead: return cat(where, " rows ", t.arg[0] * 16, "..", t.arg[1] * 16, ")");
    case Op::kAttn:
      return cat(where, " item ", t.arg[0], (t.flags & kAttnSliding) ? " sliding" : "",
                 (t.flags & kAttnNoRope) ? " nope" : "", ")");
    case Op::kExpertUp:
    case Op::kExpertDown:
    case Op::kDenseUp:
    case Op::kDenseDown: return cat(where, " share ", t.arg[0], "..", t.arg[1], " of ", t.arg[2], ")");
  }
  return where + ")";
}

}  // namespace megadecode
