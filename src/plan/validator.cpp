// The plan validator (see validator.h for the rules). Producer lists are built once per plan; the
// dependency graph is materialised deduplicated, then checked for cycles with and without list order.
#include "plan/validator.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/check.h"

namespace megadecode {
namespace {

struct Producers {
  std::vector<std::vector<int32_t>> tasks;  // [counter] every task that may arrive (static or dynamic)
  std::vector<int64_t> static_sum;          // [counter] arrivals from tasks' arrive lists
  std::vector<int64_t> reachable;           // [counter] static_sum + declared dynamic maxima
};

// "task 3 (...), task 9 (...)" (the first few).
std::string describe_tasks(const Plan& plan, const std::vector<int>& tasks) {
  std::string out;
  for (size_t i = 0; i < tasks.size() && i < 4; ++i) out += cat(i ? ", " : "", describe_task(plan, tasks[i]));
  if (tasks.size() > 4) out += cat(" and ", tasks.size() - 4, " more");
  return out;
}

void check_structure(const Plan& plan) {
  const PlanShape& s = plan.params.shape;
  MD_REQUIRE(plan.list_begin.size() >= 2 && plan.list_begin.front() == 0 &&
                 plan.list_begin.back() == static_cast<int32_t>(plan.tasks.size()),
             "plan: list bounds do not cover the task array");
  MD_REQUIRE(plan.n_sms() == s.n_sms, "plan: ", plan.n_sms(), " lists for ", s.n_sms, " SMs");
  for (int sm = 0; sm < plan.n_sms(); ++sm)
    MD_REQUIRE(plan.list_begin[sm] <= plan.list_begin[sm + 1], "plan: list of SM ", sm, " has negative length");
  MD_REQUIRE(plan.task_wave.size() == plan.tasks.size(), "plan: task_wave does not match the task count");
  MD_REQUIRE(static_cast<int32_t>(plan.counters.size()) == plan.params.counters.n_counters,
             "plan: counter table does not match the counter layout");
  // Shared experts: parallel plans only, whole up units and down row blocks, and room for their
  // activations.
  MD_REQUIRE(s.shared_inter >= 0 && s.shared_inter % 16 == 0 && s.shared_units * 8 == s.shared_inter &&
                 (s.shared_inter == 0 || s.parallel) && (s.shared_average == 0 || (s.shared_average == 1 && s.shared_inter > 0)),
             "plan: shared experts of width ", s.shared_inter, " (", s.shared_units, " up units, average ",
             s.shared_average, ") in a plan ", s.parallel ? "of parallel blocks" : "of sequential blocks");
  MD_REQUIRE(plan.params.buffers.shared_act.bytes >= static_cast<uint64_t>(s.batch) * s.shared_inter * 4,
             "plan: shared_act holds ", plan.params.buffers.shared_act.bytes, " bytes, the shared experts need ",
             static_cast<uint64_t>(s.batch) * s.shared_inter * 4);
  const int32_t n_counters = plan.params.counters.n_counters;
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) {
    const Task& t = plan.tasks[i];
    MD_REQUIRE(t.op < kNumOps, describe_task(plan, i), ": bad opcode ", static_cast<int>(t.op));
    MD_REQUIRE(t.n_waits <= kMaxWaits && t.n_arrives <= kMaxArrives, describe_task(plan, i),
               ": too many waits or arrivals");
    MD_REQUIRE(t.layer >= -1 && t.layer < s.n_layers, describe_task(plan, i), ": layer out of range");
    const uint8_t allowed = !s.parallel ? 0
                            : t.op == static_cast<uint8_t>(Op::kAttn) ? (kAttnSliding | kAttnNoRope)
                            : t.op == static_cast<uint8_t>(Op::kExpertDown) ? kLastWaitAtWrite : 0;
    MD_REQUIRE((t.flags & ~allowed) == 0, describe_task(plan, i), ": flags ", static_cast<int>(t.flags),
               allowed ? " outside the op's flags" : " on a task that takes none");
    MD_REQUIRE(!(t.flags & kLastWaitAtWrite) || t.n_waits >= 2, describe_task(plan, i),
               ": kLastWaitAtWrite on a task with fewer than two waits (its first waits are the fill's)");
    MD_REQUIRE(!(t.flags & kAttnSliding) || s.sliding_window > 0, describe_task(plan, i),
               ": sliding attention in a plan without a sliding window");
    MD_REQUIRE(s.parallel || (t.op != static_cast<uint8_t>(Op::kDenseUp) && t.op != static_cast<uint8_t>(Op::kDenseDown)),
               describe_task(plan, i), ": dense FFN shares in a plan of sequential blocks");
    const int w = plan.task_wave[i];
    MD_REQUIRE(w >= 0 && w < static_cast<int>(plan.waves.size()) && plan.waves[w].op == static_cast<Op>(t.op) &&
                   plan.waves[w].layer == t.layer,
               describe_task(plan, i), ": not in the wave its op and layer belong to");
    for (int j = 0; j < t.n_waits; ++j) {
      MD_REQUIRE(t.wait[j].counter >= 0 && t.wait[j].counter < n_counters, describe_task(plan, i),
                 ": waits on counter ", t.wait[j].counter, " outside the ", n_counters, " counters");
      MD_REQUIRE(t.wait[j].target >= 1, describe_task(plan, i), ": wait on ", counter_name(plan, t.wait[j].counter),
                 " has target ", t.wait[j].target, " < 1");
    }
    for (int j = 0; j < t.n_arrives; ++j) {
      MD_REQUIRE(t.arrive[j].counter >= 0 && t.arrive[j].counter < n_counters, describe_task(plan, i),
                 ": arrives on counter ", t.arrive[j].counter, " outside the ", n_counters, " counters");
      MD_REQUIRE(t.arrive[j].amount >= 1, describe_task(plan, i), ": arrival amount ", t.arrive[j].amount, " < 1");
    }
  }
}

// Attention items, in two sets: items [0, n_full) serve the full layers and each (seq, group)
// covers [0, n_ctx) with consecutive splits whose partials sit at part_base + split; items
// [n_full, n) serve the sliding layers and each (seq, group) covers [max(0, n_ctx - W), n_ctx), the
// same n_ctx as the full set's when both exist (every split holds at most W keys then). Every
// layer has exactly one ATTN task per item of its set (its tasks' kAttnSliding flag says which,
// the same on all of them) and none of the other set's.
void check_attn_items(const Plan& plan) {
  const PlanShape& s = plan.params.shape;
  MD_REQUIRE(static_cast<int32_t>(plan.attn_items.size()) == s.n_attn_items &&
                 plan.params.buffers.attn_items.bytes >= plan.attn_items.size() * sizeof(AttnItem),
             "plan: the attention items disagree with the plan's shape or buffer");
  const int n_full = s.parallel ? s.n_full_items : s.n_attn_items;
  MD_REQUIRE(n_full >= 0 && n_full <= s.n_attn_items, "plan: ", n_full, " full-layer items of ", s.n_attn_items);
  MD_REQUIRE(n_full == s.n_attn_items || s.sliding_window > 0, "plan: ", s.n_attn_items - n_full,
             " sliding-layer items without a sliding window");
  std::map<std::pair<int, int>, int> full_end;  // (seq, g) -> n_ctx from the full set
  auto check_set = [&](int begin, int end, bool sliding) {
    if (begin == end) return;
    std::map<std::pair<int, int>, int> next_split, next_pos, first_pos, n_splits;
    for (int i = begin; i < end; ++i) {
      const AttnItem& it = plan.attn_items[i];
      MD_REQUIRE(it.seq >= 0 && it.seq < s.batch && it.group >= 0 && it.group < s.n_kv_heads && it.n_splits >= 1 &&
                     it.split >= 0 && it.split < it.n_splits && it.pos_begin >= 0 && it.pos_begin < it.pos_end,
                 "plan: attention item ", i, " is malformed");
      auto key = std::make_pair(it.seq, it.group);
      if (it.split == 0 && !next_split.count(key)) {
        first_pos[key] = it.pos_begin;
        next_pos[key] = it.pos_begin;
        MD_REQUIRE(sliding || it.pos_begin == 0, "plan: attention item ", i, " (seq ", it.seq, ", g", it.group,
                   ") of a full layer starts at position ", it.pos_begin, ", not 0");
      }
      MD_REQUIRE(next_split[key] == it.split && next_pos[key] == it.pos_begin && it.part_base + it.split == i,
                 "plan: attention item ", i, " (seq ", it.seq, ", g", it.group, ", split ", it.split,
                 ") does not continue its sequence's splits");
      next_split[key] = it.split + 1;
      next_pos[key] = it.pos_end;
      n_splits[key] = it.n_splits;
    }
    for (const auto& [key, n] : next_split)
      MD_REQUIRE(n == n_splits[key], "plan: seq ", key.first, " g", key.second, " has ", n, " of its ", n_splits[key],
                 " splits");
    MD_REQUIRE(static_cast<int>(next_split.size()) == s.batch * s.n_kv_heads,
               "plan: some (sequence, group) has no ", sliding ? "sliding-layer" : "", " attention item");
    for (const auto& [key, end_pos] : next_pos) {
      if (!sliding) {
        full_end[key] = end_pos;
        continue;
      }
      const int ctx = full_end.count(key) ? full_end[key] : end_pos;
      MD_REQUIRE(end_pos == ctx && first_pos[key] == std::max(0, ctx - s.sliding_window), "plan: seq ", key.first,
                 " g", key.second, ": sliding-layer items cover ", first_pos[key], "..", end_pos, ", the window of ",
                 s.sliding_window, " before context ", ctx, " is ", std::max(0, ctx - s.sliding_window), "..", ctx);
    }
  };
  check_set(0, n_full, false);
  check_set(n_full, s.n_attn_items, true);

  std::vector<std::vector<std::vector<int>>> runs(s.n_layers, std::vector<std::vector<int>>(s.n_attn_items));
  std::vector<int> layer_flags(s.n_layers, -1);
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) {
    const Task& t = plan.tasks[i];
    if (t.op != static_cast<uint8_t>(Op::kAttn)) continue;
    MD_REQUIRE(t.layer >= 0 && t.arg[0] >= 0 && t.arg[0] < s.n_attn_items, describe_task(plan, i),
               ": names no attention item");
    MD_REQUIRE(layer_flags[t.layer] < 0 || layer_flags[t.layer] == t.flags, describe_task(plan, i), ": flags ",
               static_cast<int>(t.flags), ", other attention tasks of L", t.layer, " have ", layer_flags[t.layer]);
    layer_flags[t.layer] = t.flags;
    const bool sliding = t.flags & kAttnSliding;
    MD_REQUIRE(sliding == (t.arg[0] >= n_full), describe_task(plan, i), ": a ", sliding ? "sliding" : "full",
               " layer's task names item ", t.arg[0], " of the ", sliding ? "full" : "sliding", " layers' set");
    runs[t.layer][t.arg[0]].push_back(i);
  }
  for (int L = 0; L < s.n_layers; ++L) {
    const bool sliding = layer_flags[L] >= 0 && (layer_flags[L] & kAttnSliding);
    for (int i = sliding ? n_full : 0; i < (sliding ? s.n_attn_items : n_full); ++i) {
      const AttnItem& it = plan.attn_items[i];
      MD_REQUIRE(runs[L][i].size() == 1, "plan: attention item ", i, " (seq ", it.seq, ", g", it.group, ", split ",
                 it.split, ") of L", L, " runs ", runs[L][i].size(), " times",
                 runs[L][i].empty() ? ": no task of the layer names it" : cat(": ", describe_tasks(plan, runs[L][i])));
    }
  }
}

// A QKV tile feeds one KV group's attention: its rows lie inside group g, and it arrives on that
// group's qkv_done (the group's items wait for it there) and on no other group's.
void check_qkv_group(const Plan& plan, int i) {
  const Task& t = plan.tasks[i];
  const int group_rbs = plan.params.shape.qkv_group_rows / 16, g = t.arg[0] / group_rbs;
  MD_REQUIRE((t.arg[1] - 1) / group_rbs == g, describe_task(plan, i), ": rows of KV groups ", g, " and ",
             (t.arg[1] - 1) / group_rbs, " in one QKV tile");
  const int32_t own = layer_counter(plan.params.counters, t.layer, plan.params.counters.qkv_done + g);
  bool arrives = false;
  for (int j = 0; j < t.n_arrives; ++j) {
    const int32_t ctr = t.arrive[j].counter;
    MD_REQUIRE(ctr == own || plan.counters[ctr].kind != CounterKind::kQkvDone, describe_task(plan, i),
               ": rows of KV group ", g, " but arrives on ", counter_name(plan, ctr));
    arrives = arrives || ctr == own;
  }
  MD_REQUIRE(arrives, describe_task(plan, i), ": does not arrive on ", counter_name(plan, own));
}

// The shares of one op and layer (args a0, a1, T: plan/moe_split.h) tile the weight units [0, T)
// exactly: the routing formula then gives every item to one share.
void check_share_tiling(const Plan& plan, int op, int layer, std::vector<std::array<int32_t, 3>>& shares) {
  std::sort(shares.begin(), shares.end());
  int32_t at = 0;
  const int32_t total = plan.tasks[shares.front()[2]].arg[2];
  for (const auto& [a0, a1, i] : shares) {
    const Task& t = plan.tasks[i];
    MD_REQUIRE(t.arg[2] == total, describe_task(plan, i), ": its layer's other shares divide ", total, " units, not ",
               t.arg[2]);
    MD_REQUIRE(a0 == at, "plan: L", layer, " ", op_name(static_cast<Op>(op)), " units ", std::min(a0, at), "..",
               std::max(a0, at), a0 > at ? " of no share (before " : " of two shares (", describe_task(plan, i), ")");
    at = a1;
  }
  MD_REQUIRE(at == total, "plan: L", layer, " ", op_name(static_cast<Op>(op)), " units ", at, "..", total,
             " of no share (after ", describe_task(plan, shares.back()[2]), ")");
}

// GEMM tiles cover their op's row blocks exactly once per layer; the MoE shares of each layer tile
// their weight units (check_share_tiling).
void check_tiles_and_shares(const Plan& plan) {
  const PlanShape& s = plan.params.shape;
  auto rows_of = [&](Op op) -> int {
    switch (op) {
      case Op::kQkv: return s.n_kv_heads * s.qkv_group_rows / 16;
      case Op::kOProj: return s.hidden / 16;
      case Op::kRouter: return (s.n_experts + 15) / 16;
      case Op::kLmHead: return (s.vocab + 15) / 16;
      default: return 0;
    }
  };
  // (op, layer) -> the tasks that do each row block / share
  std::map<std::pair<int, int>, std::vector<std::vector<int>>> covered;
  std::map<std::pair<int, int>, std::vector<std::array<int32_t, 3>>> shares;  // (op, layer) -> (a0, a1, task)
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) {
    const Task& t = plan.tasks[i];
    const Op op = static_cast<Op>(t.op);
    if (const int n = rows_of(op); n > 0) {
      MD_REQUIRE(t.arg[0] >= 0 && t.arg[0] < t.arg[1] && t.arg[1] <= n, describe_task(plan, i),
                 ": row blocks outside the matrix's ", n);
      auto& v = covered[{t.op, t.layer}];
      v.resize(n);
      for (int rb = t.arg[0]; rb < t.arg[1]; ++rb) v[rb].push_back(i);
      if (op == Op::kQkv) check_qkv_group(plan, i);
    } else if (op_is_share(op)) {
      MD_REQUIRE(t.arg[0] >= 0 && t.arg[0] < t.arg[1] && t.arg[1] <= t.arg[2], describe_task(plan, i),
                 ": bad share (units ", t.arg[0], "..", t.arg[1], " of ", t.arg[2], ")");
      shares[{t.op, t.layer}].push_back({t.arg[0], t.arg[1], i});
    }
  }
  for (auto& [key, v] : shares) check_share_tiling(plan, key.first, key.second, v);
  for (const auto& [key, v] : covered) {
    const Op op = static_cast<Op>(key.first);
    for (size_t k = 0; k < v.size(); ++k) {
      if (v[k].size() == 1) continue;
      std::string who = cat(": ", describe_tasks(plan, v[k]));
      if (v[k].empty()) {  // name the neighbours that leave the gap
        std::string near;
        if (k > 0 && !v[k - 1].empty()) near = cat("after ", describe_task(plan, v[k - 1].back()));
        if (k + 1 < v.size() && !v[k + 1].empty())
          near += cat(near.empty() ? "" : ", ", "before ", describe_task(plan, v[k + 1].front()));
        who = cat(": no tile covers it", near.empty() ? "" : cat(" (", near, ")"));
      }
      throw Error(cat("plan: L", key.second, " ", op_name(op), " row block ", k, " runs ", v[k].size(), " times", who));
    }
  }
}

// The attention items' run-time arrivals are declared with exactly the tasks that may make them:
// every ATTN task on its (seq, group)'s split counter and on its layer's attn_done, no other task,
// adding at most one per split and one merge per (seq, group). The dependency graph takes its edges
// from these lists, so a task left out would hide a cycle or an unordered buffer reuse.
void check_dynamic_arrivals(const Plan& plan) {
  const PlanShape& s = plan.params.shape;
  const CounterLayout& c = plan.params.counters;
  const int32_t n_counters = c.n_counters, n_tasks = static_cast<int32_t>(plan.tasks.size());
  std::map<int32_t, std::vector<int32_t>> expected;  // counter -> the tasks that may arrive on it, ascending
  std::map<int32_t, int64_t> most;                   // counter -> what they add at most
  for (int32_t i = 0; i < n_tasks; ++i) {
    const Task& t = plan.tasks[i];
    if (t.op != static_cast<uint8_t>(Op::kAttn)) continue;
    const AttnItem& it = plan.attn_items[t.arg[0]];
    const int32_t split = layer_counter(c, t.layer, c.attn_split + it.seq * s.n_kv_heads + it.group);
    const int32_t done = layer_counter(c, t.layer, c.attn_done);
    expected[split].push_back(i);
    expected[done].push_back(i);
    most[split] += 1;
    if (it.split == 0) most[done] += 1;
  }
  std::set<int32_t> declared;
  for (const DynamicArrival& d : plan.dynamic_arrivals) {
    MD_REQUIRE(d.counter >= 0 && d.counter < n_counters, "plan: dynamic arrival on counter ", d.counter,
               " outside the ", n_counters, " counters");
    const std::string what = cat("plan: the dynamic arrivals on ", counter_name(plan, d.counter));
    MD_REQUIRE(declared.insert(d.counter).second, what, " are declared twice");
    for (int32_t t : d.tasks)
      MD_REQUIRE(t >= 0 && t < n_tasks, what, " name task ", t, " outside the ", n_tasks, " tasks");
    std::vector<int32_t> got = d.tasks;
    std::sort(got.begin(), got.end());
    const std::vector<int32_t>& want = expected[d.counter];
    for (int32_t t : want)
      MD_REQUIRE(std::binary_search(got.begin(), got.end(), t), what, " leave out ", describe_task(plan, t),
                 ", which may make them");
    for (int32_t t : got)
      MD_REQUIRE(std::binary_search(want.begin(), want.end(), t), what, " name ", describe_task(plan, t),
                 ", which cannot make them");
    MD_REQUIRE(d.max_amount == most[d.counter], what, " add at most ", most[d.counter], ", declared ", d.max_amount);
  }
  for (const auto& [counter, tasks] : expected)
    MD_REQUIRE(declared.count(counter), "plan: ", describe_task(plan, tasks.front()), " arrives on ",
               counter_name(plan, counter), " at run time, and no dynamic arrival declares it");
}

Producers collect_producers(const Plan& plan) {
  const size_t n = plan.counters.size();
  Producers p{std::vector<std::vector<int32_t>>(n), std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0)};
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i) {
    const Task& t = plan.tasks[i];
    for (int j = 0; j < t.n_arrives; ++j) {
      p.tasks[t.arrive[j].counter].push_back(i);
      p.static_sum[t.arrive[j].counter] += t.arrive[j].amount;
    }
  }
  p.reachable = p.static_sum;
  for (const DynamicArrival& d : plan.dynamic_arrivals) {  // checked by check_dynamic_arrivals
    p.reachable[d.counter] += d.max_amount;
    p.tasks[d.counter].insert(p.tasks[d.counter].end(), d.tasks.begin(), d.tasks.end());
  }
  for (auto& v : p.tasks) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return p;
}

void check_wait(const Plan& plan, const Producers& p, const Wait& w, const std::string& who) {
  const int64_t reach = p.reachable[w.counter];
  MD_REQUIRE(reach > 0, who, ": waits on ", counter_name(plan, w.counter), " that no task or item arrives on");
  MD_REQUIRE(w.target <= reach, who, ": waits for ", counter_name(plan, w.counter), " >= ", w.target,
             ", unreachable: its producers arrive at most ", reach, " times");
  MD_REQUIRE(w.target <= plan.counters[w.counter].total, who, ": waits for ", counter_name(plan, w.counter), " >= ",
             w.target, " but the plan expects it to reach only ", plan.counters[w.counter].total);
}

void check_satisfiable(const Plan& plan, const Producers& p) {
  for (int32_t c = 0; c < static_cast<int32_t>(plan.counters.size()); ++c) {
    const CounterInfo& info = plan.counters[c];
    MD_REQUIRE(p.static_sum[c] <= info.total && info.total <= p.reachable[c], "plan: ", counter_name(plan, c),
               " is planned to reach ", info.total, " but its producers arrive ", p.static_sum[c], "..",
               p.reachable[c], " times");
  }
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i)
    for (int j = 0; j < plan.tasks[i].n_waits; ++j) check_wait(plan, p, plan.tasks[i].wait[j], describe_task(plan, i));
}

// Deduplicated dependencies (CSR): task -> tasks it may wait for.
struct Graph {
  std::vector<int32_t> begin;
  std::vector<int32_t> deps;
};

Graph build_graph(const Plan& plan, const Producers& p) {
  const int n = static_cast<int>(plan.tasks.size());
  Graph g;
  g.begin.reserve(n + 1);
  std::vector<int32_t> stamp(n, -1);
  auto add_counter = [&](int self, int32_t c) {
    for (int32_t q : p.tasks[c])
      if (stamp[q] != self) {
        stamp[q] = self;
        g.deps.push_back(q);
      }
  };
  for (int i = 0; i < n; ++i) {
    g.begin.push_back(static_cast<int32_t>(g.deps.size()));
    const Task& t = plan.tasks[i];
    for (int j = 0; j < t.n_waits; ++j) add_counter(i, t.wait[j].counter);
  }
  g.begin.push_back(static_cast<int32_t>(g.deps.size()));
  return g;
}

// The counter through which `from` waits on `to` (for messages).
std::string via(const Plan& plan, const Producers& p, int from, int to) {
  auto produced_by_to = [&](int32_t c) { return std::binary_search(p.tasks[c].begin(), p.tasks[c].end(), to); };
  const Task& t = plan.tasks[from];
  for (int j = 0; j < t.n_waits; ++j)
    if (produced_by_to(t.wait[j].counter)) return cat("waits on ", counter_name(plan, t.wait[j].counter));
  return "waits";
}

// Iterative DFS; returns a cycle (tasks in dependency order) or empty. With list order, each task
// also depends on its predecessor in its SM's list.
std::vector<int> find_cycle(const Plan& plan, const Graph& g, bool list_order) {
  const int n = static_cast<int>(plan.tasks.size());
  std::vector<int32_t> prev_in_list(n, -1);
  if (list_order)
    for (int sm = 0; sm < plan.n_sms(); ++sm)
      for (int i = plan.list_begin[sm] + 1; i < plan.list_begin[sm + 1]; ++i) prev_in_list[i] = i - 1;
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on stack, 2 done
  std::vector<std::pair<int, int>> stack;  // (task, next edge index; -1 = list predecessor first)
  for (int root = 0; root < n; ++root) {
    if (color[root] != 0) continue;
    stack.push_back({root, -1});
    color[root] = 1;
    while (!stack.empty()) {
      auto& [v, e] = stack.back();
      int next = -1;
      if (e == -1) {
        e = g.begin[v];
        next = prev_in_list[v];
      } else if (e < g.begin[v + 1]) {
        next = g.deps[e++];
      } else {
        color[v] = 2;
        stack.pop_back();
        continue;
      }
      if (next < 0 || color[next] == 2) continue;
      if (color[next] == 1) {
        std::vector<int> cycle;
        for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
          cycle.push_back(it->first);
          if (it->first == next) break;
        }
        std::reverse(cycle.begin(), cycle.end());
        return cycle;  // cycle[i] depends on cycle[i+1], the last depends on cycle[0]
      }
      color[next] = 1;
      stack.push_back({next, -1});
    }
  }
  return {};
}

std::string describe_cycle(const Plan& plan, const Producers& p, const std::vector<int>& cycle) {
  std::string s;
  for (size_t i = 0; i < cycle.size(); ++i) {
    const int from = cycle[i], to = cycle[(i + 1) % cycle.size()];
    const std::string how = via(plan, p, from, to);
    const bool order = how == "waits" && plan.sm_of(from) == plan.sm_of(to) && to == from - 1;
    s += cat(i == 0 ? "" : "; ", describe_task(plan, from), order ? " runs after " : cat(" ", how, " from "),
             describe_task(plan, to));
  }
  return s;
}

void check_self_deadlock(const Plan& plan, const Producers& p) {
  for (int sm = 0; sm < plan.n_sms(); ++sm) {
    const int begin = plan.list_begin[sm], end = plan.list_begin[sm + 1];
    for (int i = begin; i < end; ++i) {
      const Task& t = plan.tasks[i];
      for (int j = 0; j < t.n_waits; ++j) {
        const Wait& w = t.wait[j];
        int64_t later = 0;
        int example = -1;
        for (int32_t q : p.tasks[w.counter]) {
          if (q < i || q >= end) continue;
          for (int k = 0; k < plan.tasks[q].n_arrives; ++k)
            if (plan.tasks[q].arrive[k].counter == w.counter) later += plan.tasks[q].arrive[k].amount;
          if (example < 0 && later > 0) example = q;
        }
        MD_REQUIRE(p.reachable[w.counter] - later >= w.target, "self-deadlock: ", describe_task(plan, i),
                   " waits for ", counter_name(plan, w.counter), " >= ", w.target, ", which needs ",
                   describe_task(plan, example), " that comes later in the same SM's list");
      }
    }
  }
}

void check_waves(const Plan& plan, const Graph& g) {
  for (int sm = 0; sm < plan.n_sms(); ++sm)
    for (int i = plan.list_begin[sm] + 1; i < plan.list_begin[sm + 1]; ++i)
      MD_REQUIRE(plan.task_wave[i - 1] <= plan.task_wave[i], describe_task(plan, i), " (wave ", plan.task_wave[i],
                 ") comes after ", describe_task(plan, i - 1), " of the later wave ", plan.task_wave[i - 1]);
  for (int i = 0; i < static_cast<int>(plan.tasks.size()); ++i)
    for (int e = g.begin[i]; e < g.begin[i + 1]; ++e)
      MD_REQUIRE(plan.task_wave[g.deps[e]] < plan.task_wave[i], describe_task(plan, i), " (wave ", plan.task_wave[i],
                 ") waits on ", describe_task(plan, g.deps[e]), " of wave ", plan.task_wave[g.deps[e]],
                 ", not an earlier one");
}

// Buffers are reused from layer to layer, which is safe only if the layer funnels: the next layer's
// QKV tiles (or the LM head) come after every task of layer L. Checked by a backward search from one
// task of the funnel wave (all its tasks must wait on the same counters), which stops at earlier
// layers.
void check_funnels(const Plan& plan, const Graph& g) {
  const int n = static_cast<int>(plan.tasks.size());
  const int n_layers = plan.params.shape.n_layers;
  auto layer_of = [&](int t) { return plan.tasks[t].layer < 0 ? n_layers : plan.tasks[t].layer; };
  std::vector<std::vector<int>> wave_tasks(plan.waves.size());
  for (int i = 0; i < n; ++i) wave_tasks[plan.task_wave[i]].push_back(i);
  std::vector<int> seen(n, -1);
  auto check = [&](int funnel_wave, int layer) {
    const std::vector<int>& tasks = wave_tasks[funnel_wave];
    if (tasks.empty()) return;
    const Task& rep = plan.tasks[tasks[0]];
    for (int t : tasks) {
      const Task& u = plan.tasks[t];
      bool same = u.n_waits == rep.n_waits;
      for (int j = 0; same && j < u.n_waits; ++j)
        same = u.wait[j].counter == rep.wait[j].counter && u.wait[j].target == rep.wait[j].target;
      MD_REQUIRE(same, describe_task(plan, t), " does not wait like the rest of its wave, which must funnel layer ", layer);
    }
    std::vector<int> stack{tasks[0]};
    seen[tasks[0]] = funnel_wave;
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      for (int e = g.begin[v]; e < g.begin[v + 1]; ++e) {
        const int d = g.deps[e];
        if (seen[d] == funnel_wave || layer_of(d) < layer) continue;
        seen[d] = funnel_wave;
        stack.push_back(d);
      }
    }
    for (int w = 0; w < funnel_wave; ++w) {
      if (plan.waves[w].layer != layer) continue;
      for (int t : wave_tasks[w])
        MD_REQUIRE(seen[t] == funnel_wave, "unsafe buffer reuse: ", describe_task(plan, t),
                   " is not ordered before ", describe_task(plan, tasks[0]), ", which overwrites what it uses");
    }
  };
  for (int w = 0; w < static_cast<int>(plan.waves.size()); ++w) {
    const WaveInfo& wave = plan.waves[w];
    // Parallel blocks: the router tiles and dense up shares read the layer input too.
    const bool first_of_layer = wave.op == Op::kQkv || (plan.params.shape.parallel && !plan.params.shape.router_after_attn &&
                                                        (wave.op == Op::kRouter || wave.op == Op::kDenseUp));
    if ((first_of_layer && wave.layer > 0) || wave.op == Op::kLmHead)
      check(w, wave.op == Op::kLmHead ? n_layers - 1 : wave.layer - 1);
  }
}

// Parallel blocks (op_table.h, task.h): the down shares write x = (x + o) + F, so every down share
// must come after all of its layer's O-proj tiles (the o it adds) and every reader of the x it
// overwrites (QKV tiles, router tiles, up shares); O-proj reads the attention output, so it comes
// after all of its layer's attention items; and the FFN's first half must run beside attention: no
// router or up task may wait, even through other tasks, on its layer's attention or O-proj (the
// router-after-attn and grid-sync ablations let them wait on attention, never on O-proj).
// A layer has either router and expert shares or dense shares.
void check_parallel_blocks(const Plan& plan, const Graph& g) {
  const PlanShape& s = plan.params.shape;
  if (!s.parallel) return;
  const int n = static_cast<int>(plan.tasks.size());
  std::vector<std::vector<int>> by_layer(s.n_layers);
  for (int i = 0; i < n; ++i)
    if (plan.tasks[i].layer >= 0) by_layer[plan.tasks[i].layer].push_back(i);
  std::vector<int> seen(n, -1);
  int stamp = 0;
  // The same-layer tasks `from` depends on, transitively (the search stops at other layers).
  auto reach = [&](int from) {
    ++stamp;
    std::vector<int> stack{from};
    const int layer = plan.tasks[from].layer;
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      for (int e = g.begin[v]; e < g.begin[v + 1]; ++e) {
        const int d = g.deps[e];
        if (seen[d] == stamp || plan.tasks[d].layer != layer) continue;
        seen[d] = stamp;
        stack.push_back(d);
      }
    }
  };
  auto is = [&](int t, Op op) { return plan.tasks[t].op == static_cast<uint8_t>(op); };
  // The ablations give the overlap up: router-after-attn, and grid-sync (every wave after the last).
  const bool overlap = !s.router_after_attn && !s.grid_sync;
  for (int L = 0; L < s.n_layers; ++L) {
    bool routed = false, dense = false;
    for (int t : by_layer[L]) {
      routed = routed || is(t, Op::kRouter) || is(t, Op::kExpertUp) || is(t, Op::kExpertDown);
      dense = dense || is(t, Op::kDenseUp) || is(t, Op::kDenseDown);
    }
    MD_REQUIRE(!(routed && dense), "plan: L", L, " has both routed experts and dense FFN shares");
    MD_REQUIRE(routed || dense, "plan: L", L, " has no FFN tasks");
    // One search per distinct (op, wait list): a wave's tasks mostly share theirs.
    std::set<std::vector<std::pair<int32_t, int32_t>>> done;
    for (int t : by_layer[L]) {
      const bool oproj = is(t, Op::kOProj);
      const bool down = is(t, Op::kExpertDown) || is(t, Op::kDenseDown);
      const bool ffn = is(t, Op::kRouter) || is(t, Op::kExpertUp) || is(t, Op::kDenseUp);
      if (!oproj && !ffn && !down) continue;
      std::vector<std::pair<int32_t, int32_t>> key{{plan.tasks[t].op, -1}};
      for (int j = 0; j < plan.tasks[t].n_waits; ++j) key.push_back({plan.tasks[t].wait[j].counter, plan.tasks[t].wait[j].target});
      if (!done.insert(key).second) continue;
      reach(t);  // marks seen[] with the current stamp
      for (int u : by_layer[L]) {
        const bool hit = seen[u] == stamp;
        if (down && (is(u, Op::kOProj) || is(u, Op::kQkv) || is(u, Op::kRouter) || is(u, Op::kExpertUp) ||
                     is(u, Op::kDenseUp)))
          MD_REQUIRE(hit, "parallel block: ", describe_task(plan, t), " writes x = x + o + F but does not wait "
                     "(directly or through other tasks) on ", describe_task(plan, u), " of its layer");
        if (oproj && is(u, Op::kAttn))
          MD_REQUIRE(hit, "parallel block: ", describe_task(plan, t), " reads the attention output but does not "
                     "wait (directly or through other tasks) on ", describe_task(plan, u), " of its layer");
        if (ffn && hit && (is(u, Op::kOProj) || (is(u, Op::kAttn) && overlap)))
          throw Error(cat("parallel block: ", describe_task(plan, t), " waits (directly or through other tasks) on ",
                          describe_task(plan, u), ": the FFN must not wait on its layer's ",
                          is(u, Op::kAttn) ? "attention" : "O-proj"));
      }
    }
  }
}

}  // namespace

// Every down share (EXPERT_DOWN, DENSE_DOWN) reads activation rows that any up share of its layer
// may have written (the routed experts' act, the shared experts' shared_act, the dense MLP's act),
// so it must wait, directly or through other tasks, on every up share of its layer.
void check_down_after_up(const Plan& plan, const Graph& g) {
  const int n = static_cast<int>(plan.tasks.size());
  auto is = [&](int t, Op a, Op b) { return plan.tasks[t].op == static_cast<uint8_t>(a) || plan.tasks[t].op == static_cast<uint8_t>(b); };
  std::vector<std::vector<int>> ups(plan.params.shape.n_layers);
  for (int i = 0; i < n; ++i)
    if (plan.tasks[i].layer >= 0 && is(i, Op::kExpertUp, Op::kDenseUp)) ups[plan.tasks[i].layer].push_back(i);
  std::vector<int> seen(n, -1);
  std::set<std::pair<int, std::vector<std::pair<int32_t, int32_t>>>> done;  // one search per (layer, wait list)
  for (int i = 0; i < n; ++i) {
    if (plan.tasks[i].layer < 0 || !is(i, Op::kExpertDown, Op::kDenseDown)) continue;
    const Task& t = plan.tasks[i];
    std::vector<std::pair<int32_t, int32_t>> key;
    for (int j = 0; j < t.n_waits; ++j) key.push_back({t.wait[j].counter, t.wait[j].target});
    if (!done.insert({t.layer, key}).second) continue;
    std::vector<int> stack{i};
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      for (int e = g.begin[v]; e < g.begin[v + 1]; ++e) {
        const int d = g.deps[e];
        if (seen[d] == i || plan.tasks[d].layer != t.layer) continue;
        seen[d] = i;
        stack.push_back(d);
      }
    }
    for (int u : ups[t.layer])
      MD_REQUIRE(seen[u] == i, describe_task(plan, i), " does not wait (directly or through other tasks) on ",
                 describe_task(plan, u), ", whose activations it reads");
  }
}

// The megakernel's loader computes a layer's routing when its walk reaches the layer's first routed
// task on the SM (cuda/megakernel/loader.cuh route_layer), into the one set of routing tables the
// SM's consumers read:
//   1. that task is an EXPERT_UP share whose last wait is the layer's router tiles (the loader
//      waits on it before it reads the logits);
//   2. on each list, the routed tasks come layer by layer (no routed task of a layer after one of a
//      later layer), and every ROUTER tile of a routed layer depends (directly or through other
//      tasks) on every EXPERT_DOWN share of the previous routed layer: by the time the loader may
//      overwrite the tables, every SM's consumers are done with the previous layer's.
void check_routing_order(const Plan& plan, const Producers& producers, const Graph& g) {
  const PlanShape& s = plan.params.shape;
  const int n = static_cast<int>(plan.tasks.size());
  auto is = [&](int t, Op a) { return plan.tasks[t].op == static_cast<uint8_t>(a); };
  auto routed = [&](int t) { return plan.tasks[t].layer >= 0 && (is(t, Op::kExpertUp) || is(t, Op::kExpertDown)); };
  std::vector<std::vector<int>> downs(s.n_layers), routers(s.n_layers);
  for (int i = 0; i < n; ++i) {
    if (plan.tasks[i].layer < 0) continue;
    if (is(i, Op::kExpertDown)) downs[plan.tasks[i].layer].push_back(i);
    if (is(i, Op::kRouter)) routers[plan.tasks[i].layer].push_back(i);
  }
  std::vector<int> seen(n, -1);
  // Marks (with `mark`) every task `from` reaches through dependencies, down to layer `floor`.
  auto reach = [&](std::vector<int> stack, int mark, int floor) {
    for (int v : stack) seen[v] = mark;
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      for (int e = g.begin[v]; e < g.begin[v + 1]; ++e) {
        const int d = g.deps[e];
        if (seen[d] == mark || plan.tasks[d].layer < floor) continue;
        seen[d] = mark;
        stack.push_back(d);
      }
    }
  };
  std::set<std::pair<int32_t, int32_t>> checked;  // (counter, layer) of the last waits already searched
  for (int sm = 0; sm < plan.n_sms(); ++sm) {
    int last = -1;
    for (int i = plan.list_begin[sm]; i < plan.list_begin[sm + 1]; ++i) {
      if (!routed(i)) continue;
      const Task& t = plan.tasks[i];
      MD_REQUIRE(t.layer >= last, describe_task(plan, i), " comes after a routed task of layer ", last, " on SM ", sm);
      if (t.layer == last) continue;
      last = t.layer;
      MD_REQUIRE(is(i, Op::kExpertUp) && t.n_waits >= 1, describe_task(plan, i), " is the first routed task of its layer on SM ",
                 sm, " but not an expert-up share with a wait");
      const int32_t c = t.wait[t.n_waits - 1].counter;
      if (!checked.insert({c, t.layer}).second) continue;
      std::vector<int> from(producers.tasks[c].begin(), producers.tasks[c].end());
      reach(from, n + i, t.layer);
      for (int r : routers[t.layer])
        MD_REQUIRE(seen[r] == n + i, describe_task(plan, i), " is the first routed task of its layer on SM ", sm,
                   " but its last wait does not imply ", describe_task(plan, r), ": the loader reads the logits after it");
    }
  }
  int prev = -1;  // the previous routed layer
  for (int L = 0; L < s.n_layers; ++L) {
    if (downs[L].empty()) continue;
    if (prev >= 0)
      for (int r : routers[L]) {
        reach({r}, r, prev);
        for (int d : downs[prev])
          MD_REQUIRE(seen[d] == r, describe_task(plan, r), " does not wait (directly or through other tasks) on ",
                     describe_task(plan, d), ": the loader of that SM could overwrite routing tables in use");
      }
    prev = L;
  }
}

void validate_plan(const Plan& plan) {
  check_structure(plan);
  check_attn_items(plan);
  check_tiles_and_shares(plan);
  check_dynamic_arrivals(plan);
  const Producers producers = collect_producers(plan);
  check_satisfiable(plan, producers);
  const Graph graph = build_graph(plan, producers);
  if (auto cycle = find_cycle(plan, graph, false); !cycle.empty())
    throw Error(cat("dependency cycle: ", describe_cycle(plan, producers, cycle)));
  check_self_deadlock(plan, producers);
  if (auto cycle = find_cycle(plan, graph, true); !cycle.empty())
    throw Error(cat("deadlock through list order: ", describe_cycle(plan, producers, cycle)));
  check_waves(plan, graph);
  check_funnels(plan, graph);
  check_down_after_up(plan, graph);  // (first: its message is the more specific one)
  check_parallel_blocks(plan, graph);
  check_routing_order(plan, producers, graph);
}

}  // namespace megadecode
