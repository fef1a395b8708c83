// Plan statistics (see stats.h). Byte counts assume bf16 weights and a bf16 KV cache, as on the GPU.
#include "plan/stats.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "plan/moe_split.h"

namespace megadecode {
namespace {

// bf16 weight bytes one GEMM task streams (16-row blocks x K x 2 bytes).
int64_t task_weight_bytes(const PlanShape& s, const Task& t) {
  const int64_t rbs = t.arg[1] - t.arg[0];
  switch (static_cast<Op>(t.op)) {
    case Op::kQkv:
    case Op::kRouter:
    case Op::kLmHead: return rbs * 16 * s.hidden * 2;
    case Op::kOProj: return rbs * 16 * static_cast<int64_t>(s.n_heads) * s.head_dim * 2;
    case Op::kDenseUp: {  // a share of the dense MLP's units (8 gate + 8 up rows)
      const MoeShare u = moe_share(s.dense_units, t.arg[0], t.arg[1], t.arg[2]);
      return int64_t{u.end - u.begin} * 16 * s.hidden * 2;
    }
    case Op::kDenseDown: {
      const MoeShare r = moe_share(s.down_rbs, t.arg[0], t.arg[1], t.arg[2]);
      return int64_t{r.end - r.begin} * 16 * s.dense_inter * 2;
    }
    default: return 0;
  }
}

// Longest chain of tasks; waves are strictly ordered, so (wave, index) order is topological.
int critical_path(const Plan& plan, bool list_order) {
  const int n = static_cast<int>(plan.tasks.size());
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return plan.task_wave[a] < plan.task_wave[b]; });
  // Producers per counter: static arrivals and every task that may make a dynamic one.
  std::vector<std::vector<int>> producers(plan.counters.size());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < plan.tasks[i].n_arrives; ++j) producers[plan.tasks[i].arrive[j].counter].push_back(i);
  for (const DynamicArrival& d : plan.dynamic_arrivals)
    for (int t : d.tasks) producers[d.counter].push_back(t);
  // A counter's depth: the deepest of its producers, memoised per wave pass.
  std::vector<int> depth(n, 0), counter_depth(plan.counters.size(), -1);
  auto cdepth = [&](int32_t c) {
    if (counter_depth[c] < 0) {
      int d = 0;
      for (int p : producers[c]) d = std::max(d, depth[p]);
      counter_depth[c] = d;
    }
    return counter_depth[c];
  };
  int best = 0;
  int current_wave = -1;
  for (int i : order) {
    if (plan.task_wave[i] != current_wave) {  // producers of later waves' counters are now final
      current_wave = plan.task_wave[i];
      std::fill(counter_depth.begin(), counter_depth.end(), -1);
    }
    const Task& t = plan.tasks[i];
    int d = 0;
    for (int j = 0; j < t.n_waits; ++j) d = std::max(d, cdepth(t.wait[j].counter));
    const int sm = plan.sm_of(i);
    if (list_order && i > plan.list_begin[sm]) d = std::max(d, depth[i - 1]);
    depth[i] = d + 1;
    best = std::max(best, depth[i]);
  }
  return best;
}

}  // namespace

PlanStats plan_stats(const Plan& plan) {
  const PlanShape& s = plan.params.shape;
  PlanStats st;
  st.policy = plan.policy;
  st.n_sms = s.n_sms;
  st.batch = s.batch;
  st.n_layers = s.n_layers;
  st.n_tasks = static_cast<int64_t>(plan.tasks.size());
  st.n_waves = static_cast<int>(plan.waves.size());
  st.task_bytes = st.n_tasks * static_cast<int64_t>(sizeof(Task));

  std::vector<OpStats> per_op(kNumOps);
  for (int o = 0; o < kNumOps; ++o) per_op[o].op = static_cast<Op>(o);
  std::vector<int64_t> sm_tasks(s.n_sms, 0), sm_bytes(s.n_sms, 0);
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) {
    const Task& t = plan.tasks[i];
    const int64_t b = task_weight_bytes(s, t);
    OpStats& o = per_op[t.op];
    ++o.tasks;
    o.bytes_per_item = std::max(o.bytes_per_item, b);
    o.total_bytes += b;
    const int sm = plan.sm_of(i);
    ++sm_tasks[sm];
    sm_bytes[sm] += b;
  }
  // Attention reads K and V of its positions; the experts at the worst case (every routable
  // expert active, and the shared experts' MLP), shared evenly by the SMs' tasks.
  // Each layer's ATTN tasks name the items of its set (sliding layers: only their window).
  const int64_t L = s.n_layers;
  OpStats& attn = per_op[static_cast<int>(Op::kAttn)];
  attn.items = attn.tasks;
  std::vector<int64_t> ctx(s.batch, 0);
  for (const AttnItem& it : plan.attn_items) ctx[it.seq] = std::max<int64_t>(ctx[it.seq], it.pos_end);
  for (const Task& t : plan.tasks) {
    if (t.op != static_cast<uint8_t>(Op::kAttn)) continue;
    const AttnItem& it = plan.attn_items[t.arg[0]];
    const int64_t kv = static_cast<int64_t>(it.pos_end - it.pos_begin) * s.head_dim * 2 * 2;
    attn.bytes_per_item = std::max(attn.bytes_per_item, kv);
    attn.total_bytes += kv;
  }
  st.kv_bytes_read = attn.total_bytes;
  for (int64_t n : ctx) st.kv_bytes_full_attention += n * s.n_kv_heads * s.head_dim * 2 * 2 * L;
  st.sliding_window = s.sliding_window;
  const int64_t active = std::min(s.n_experts, s.batch * s.top_k);
  OpStats& up = per_op[static_cast<int>(Op::kExpertUp)];
  up.items = (active * s.up_units + s.shared_units) * L;
  up.total_bytes = up.items * 16LL * s.hidden * 2;
  up.bytes_per_item = (up.total_bytes / L + s.n_sms - 1) / s.n_sms;
  OpStats& down = per_op[static_cast<int>(Op::kExpertDown)];
  down.items = active * s.down_rbs * L;
  down.total_bytes = down.items * 16LL * s.moe_inter * 2 + s.down_rbs * 16LL * s.shared_inter * 2 * L;
  down.bytes_per_item = (down.total_bytes / L + s.n_sms - 1) / s.n_sms;
  for (const OpStats& o : per_op)
    if (o.tasks > 0) st.ops.push_back(o);

  st.tasks_per_sm_min = *std::min_element(sm_tasks.begin(), sm_tasks.end());
  st.tasks_per_sm_max = *std::max_element(sm_tasks.begin(), sm_tasks.end());
  st.tasks_per_sm_mean = static_cast<double>(st.n_tasks) / s.n_sms;
  st.static_bytes_per_sm_min = *std::min_element(sm_bytes.begin(), sm_bytes.end());
  st.static_bytes_per_sm_max = *std::max_element(sm_bytes.begin(), sm_bytes.end());
  int64_t total = 0;
  for (int64_t b : sm_bytes) total += b;
  st.static_bytes_per_sm_mean = static_cast<double>(total) / s.n_sms;

  st.n_counters = plan.params.counters.n_counters;
  st.counter_bytes = static_cast<int64_t>(st.n_counters) * plan.params.counters.stride_bytes;
  st.attn_items = s.n_attn_items;
  for (const AttnItem& it : plan.attn_items) st.attn_max_splits = std::max(st.attn_max_splits, it.n_splits);
  st.arena_bytes = static_cast<int64_t>(plan.params.buffers.total_bytes);
  st.critical_path_tasks = critical_path(plan, false);
  st.critical_path_tasks_ordered = critical_path(plan, true);
  return st;
}

std::string format_plan_stats(const PlanStats& st) {
  auto mb = [](double b) { return b / (1024.0 * 1024.0); };
  std::string out = cat("plan: policy ", st.policy, ", batch ", st.batch, ", ", st.n_layers, " layers, ", st.n_sms,
                        " SMs\n");
  out += cat("  ", st.n_tasks, " tasks in ", st.n_waves, " waves (", st.task_bytes / 1024, " KiB of task records)\n\n");
  char line[256];
  std::snprintf(line, sizeof line, "  %-12s %9s %10s %14s %14s\n", "op", "tasks", "items", "KiB/task", "MiB/step");
  out += line;
  for (const OpStats& o : st.ops) {
    std::snprintf(line, sizeof line, "  %-12s %9lld %10lld %14.1f %14.1f\n", op_name(o.op),
                  static_cast<long long>(o.tasks), static_cast<long long>(o.items), o.bytes_per_item / 1024.0,
                  mb(static_cast<double>(o.total_bytes)));
    out += line;
  }
  out += "  (experts at the worst case, every routable expert active: items are up units of 16 rows and down\n"
         "   (row block, expert) pairs; KiB/task is one SM's share; attention items are tasks)\n\n";
  std::snprintf(line, sizeof line, "  tasks per SM: min %lld, mean %.1f, max %lld\n",
                static_cast<long long>(st.tasks_per_sm_min), st.tasks_per_sm_mean,
                static_cast<long long>(st.tasks_per_sm_max));
  out += line;
  std::snprintf(line, sizeof line, "  static weight MiB per SM: min %.2f, mean %.2f, max %.2f\n",
                mb(static_cast<double>(st.static_bytes_per_sm_min)), mb(st.static_bytes_per_sm_mean),
                mb(static_cast<double>(st.static_bytes_per_sm_max)));
  out += line;
  out += cat("  counters: ", st.n_counters, " (", st.counter_bytes / 1024, " KiB at ",
             st.n_counters > 0 ? st.counter_bytes / st.n_counters : 0, " B each, zeroed per launch)\n");
  if (st.sliding_window > 0)
    out += cat("  attention: ", st.attn_items, " items in two sets (full layers: from position 0; sliding layers: ",
               "the last ", st.sliding_window, " positions), at most ", st.attn_max_splits, " splits per sequence\n");
  else
    out += cat("  attention: ", st.attn_items, " items per layer (at most ", st.attn_max_splits,
               " splits per sequence)\n");
  if (st.sliding_window > 0) {
    std::snprintf(line, sizeof line,
                  "  KV read per step: %.2f MiB (sliding layers: the last %d positions); full attention on every "
                  "layer: %.2f MiB; ratio %.3f\n",
                  mb(static_cast<double>(st.kv_bytes_read)), st.sliding_window,
                  mb(static_cast<double>(st.kv_bytes_full_attention)),
                  static_cast<double>(st.kv_bytes_read) / static_cast<double>(st.kv_bytes_full_attention));
    out += line;
  }
  std::snprintf(line, sizeof line, "  buffer arena: %.2f MiB\n", mb(static_cast<double>(st.arena_bytes)));
  out += line;
  out += cat("  critical path: ", st.critical_path_tasks, " tasks (dependencies), ", st.critical_path_tasks_ordered,
             " tasks (dependencies + list order)\n");
  return out;
}

nlohmann::json plan_stats_json(const PlanStats& st) {
  nlohmann::json j;
  j["policy"] = st.policy;
  j["n_sms"] = st.n_sms;
  j["batch"] = st.batch;
  j["n_layers"] = st.n_layers;
  j["n_tasks"] = st.n_tasks;
  j["n_waves"] = st.n_waves;
  j["task_bytes"] = st.task_bytes;
  for (const OpStats& o : st.ops)
    j["ops"][op_name(o.op)] = {{"tasks", o.tasks}, {"items", o.items}, {"bytes_per_item", o.bytes_per_item},
                               {"total_bytes", o.total_bytes}};
  j["tasks_per_sm"] = {{"min", st.tasks_per_sm_min}, {"mean", st.tasks_per_sm_mean}, {"max", st.tasks_per_sm_max}};
  j["static_weight_bytes_per_sm"] = {
      {"min", st.static_bytes_per_sm_min}, {"mean", st.static_bytes_per_sm_mean}, {"max", st.static_bytes_per_sm_max}};
  j["counters"] = {{"n", st.n_counters}, {"bytes", st.counter_bytes}};
  j["attention"] = {{"items", st.attn_items}, {"max_splits", st.attn_max_splits}};
  if (st.sliding_window > 0)
    j["kv_bytes"] = {{"read", st.kv_bytes_read},
                     {"full_attention", st.kv_bytes_full_attention},
                     {"ratio", static_cast<double>(st.kv_bytes_read) / static_cast<double>(st.kv_bytes_full_attention)},
                     {"sliding_window", st.sliding_window}};
  j["arena_bytes"] = st.arena_bytes;
  j["critical_path_tasks"] = st.critical_path_tasks;
  j["critical_path_tasks_ordered"] = st.critical_path_tasks_ordered;
  return j;
}

}  // namespace megadecode
