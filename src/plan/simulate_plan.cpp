// Plan -> SimPlan (simulate_plan.h): the op table, task costs and bytes, attention items from the
// plan, expert shares from the simulated routing.
#include "plan/simulate_plan.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"
#include "plan/gemm_geometry.h"
#include "plan/moe_split.h"

namespace megadecode {
namespace {

int64_t span(int32_t a, int32_t b) { return std::max<int64_t>(0, static_cast<int64_t>(b) - a); }
// bf16 weight bytes of a GEMM tile: 16-row blocks x K x 2 (task.h gives each op's row blocks).
int64_t rbs_x_hidden(const PlanShape& s, const Task& t) { return span(t.arg[0], t.arg[1]) * 16 * s.hidden * 2; }
int64_t oproj_bytes(const PlanShape& s, const Task& t) {
  return span(t.arg[0], t.arg[1]) * 16 * static_cast<int64_t>(s.n_heads) * s.head_dim * 2;
}
// A dense FFN share's weight bytes (plan/moe_split.h: units of 8 gate + 8 up rows; down row blocks).
int64_t dense_up_bytes(const PlanShape& s, const Task& t) {
  const MoeShare u = moe_share(s.dense_units, t.arg[0], t.arg[1], t.arg[2]);
  return span(u.begin, u.end) * 16 * s.hidden * 2;
}
int64_t dense_down_bytes(const PlanShape& s, const Task& t) {
  const MoeShare r = moe_share(s.down_rbs, t.arg[0], t.arg[1], t.arg[2]);
  return span(r.begin, r.end) * 16 * static_cast<int64_t>(s.dense_inter) * 2;
}
// Tokens of a SAMPLE task, which its per-token cost multiplies.
int64_t task_tokens(const PlanShape&, const Task& t) { return span(t.arg[0], t.arg[1]); }

// THE op table: every op's class and its amount (GEMM: weight bytes of the task; SAMPLE: tokens,
// which op_us multiplies; attention and routed shares: computed below). New ops are mapped here and
// nowhere else.
struct SimOpRow {
  Op op;
  SimClass cls;
  int64_t (*amount)(const PlanShape&, const Task&);
};
constexpr SimOpRow kSimOps[] = {
    {Op::kQkv, SimClass::kGemm, rbs_x_hidden},        {Op::kAttn, SimClass::kAttention, nullptr},
    {Op::kOProj, SimClass::kGemm, oproj_bytes},       {Op::kRouter, SimClass::kGemm, rbs_x_hidden},
    {Op::kExpertUp, SimClass::kRouted, nullptr},      {Op::kExpertDown, SimClass::kRouted, nullptr},
    {Op::kLmHead, SimClass::kGemm, rbs_x_hidden},     {Op::kSample, SimClass::kTiny, task_tokens},
    {Op::kDenseUp, SimClass::kGemm, dense_up_bytes},  {Op::kDenseDown, SimClass::kGemm, dense_down_bytes},
};
constexpr bool table_covers_every_op() {
  if (std::size(kSimOps) != static_cast<size_t>(kNumOps)) return false;
  for (int i = 0; i < kNumOps; ++i)
    if (static_cast<int>(kSimOps[i].op) != i) return false;
  return true;
}
static_assert(table_covers_every_op(), "kSimOps needs one row per op, in Op order");

const SimOpRow& row(Op op) { return kSimOps[static_cast<int>(op)]; }

double us_for(int64_t bytes, double gbps) { return static_cast<double>(bytes) / (gbps * 1e3); }

SimItem attention_item(const PlanShape& s, const CounterLayout& c, const AttnItem& it, int layer, const SimParams& p) {
  SimItem item;
  const int64_t kv_bytes = span(it.pos_begin, it.pos_end) * s.head_dim * 2 * 2;  // K and V, bf16
  item.pre_us = p.pre_wait_us[static_cast<int>(Op::kAttn)];
  item.cost_us = p.op_us[static_cast<int>(Op::kAttn)] + us_for(kv_bytes, p.attention.kv_gbps);
  item.split_counter = layer_counter(c, layer, c.attn_split + it.seq * s.n_kv_heads + it.group);
  item.n_splits = it.n_splits;
  item.merge_us = p.attention.merge_us_per_split * it.n_splits;
  item.merge_arrives.push_back({layer_counter(c, layer, c.attn_done), 1});
  return item;
}

// Activation-window refills of a static GEMM tile of n_rb row blocks beyond the task's first fill:
// one per window of every page group when K needs several windows.
int64_t tile_refills(const GemmGeo& g, int64_t n_rb) {
  const int32_t windows = g.n_windows();
  if (windows <= 1 || n_rb <= 0) return 0;
  return (n_rb + g.page_rb - 1) / g.page_rb * windows - 1;
}

// Expert share `share` of `n` in one layer (plan/moe_split.h) as the kernel walks it
// (cuda/megakernel/ops.cuh op_gemm): its weight bytes (pages), jobs and activation fills.
//   up: a range of the expert-major units, one job per expert it touches; its whole-K fill is its
//     pre-wait work, and with several windows a fill per window of every row block instead;
//   down: per row block of its range, a job per (active expert, token chunk) (down_walk_next), and
//     a fill whenever a job's slots are not in the area (down_group_end), the first one counted in
//     the task's cost.
struct Share {
  int64_t bytes = 0, jobs = 0, fills = 0;
};
// A layer's simulated routing as the shares walk it: the active experts' token counts in expert
// order, and one past each one's last slot (slots are expert-major).
struct LayerRouting {
  std::vector<int32_t> count, end;
  explicit LayerRouting(const std::vector<int>& per_expert) {
    for (int c : per_expert)
      if (c > 0) {
        count.push_back(c);
        end.push_back((end.empty() ? 0 : end.back()) + c);
      }
  }
};
Share expert_share(const PlanShape& s, const GemmGeo (&geo)[kNumGemmKinds], const LayerRouting& lr, Op op,
                   const Task& t) {
  const int32_t n_active = static_cast<int32_t>(lr.count.size());
  Share sh;
  if (op == Op::kExpertUp) {
    // Routed units, then the shared experts' (one more job when the share reaches them).
    const int32_t routed = n_active * s.up_units;
    const MoeShare u = moe_share(routed + s.shared_units, t.arg[0], t.arg[1], t.arg[2]);
    const int64_t units = u.end - u.begin;
    const int32_t r_end = std::min(u.end, routed);
    sh.bytes = units * 16 * s.hidden * 2;
    sh.jobs = (r_end > u.begin ? (r_end - 1) / s.up_units - u.begin / s.up_units + 1 : 0) + (u.end > routed ? 1 : 0);
    const int32_t windows = geo[kGemmUp].n_windows();
    sh.fills = windows > 1 ? units * windows : 0;
    return sh;
  }
  const MoeShare r = moe_share(s.down_rbs, t.arg[0], t.arg[1], t.arg[2]);
  const GemmGeo& g = geo[kGemmDown];
  int32_t rb = r.begin, ei = 0, tok = 0, s0 = 0, s1 = 0;
  DownJob job;
  while (down_walk_next(rb, ei, tok, r.end, n_active, g.rows_cap, [&](int32_t i) { return lr.count[i]; }, job)) {
    ++sh.jobs;
    const int32_t j0 = lr.end[job.ei] - lr.count[job.ei] + job.tok0, j1 = j0 + job.n_tok;
    if (j0 < s0 || j1 > s1) {
      s0 = j0;
      s1 = down_group_end([&](int32_t i) { return lr.end[i]; }, n_active, job.ei + 1, j0, j1, g.rows_cap);
      ++sh.fills;
    }
  }
  sh.bytes = sh.jobs * 16 * s.moe_inter * 2;  // one row block of one expert per job
  sh.fills = sh.fills > 0 ? sh.fills - 1 : 0;
  if (s.shared_inter > 0) {  // and a job per row block of the shared experts' down rows
    sh.jobs += span(r.begin, r.end);
    sh.bytes += span(r.begin, r.end) * 16 * s.shared_inter * 2;
  }
  return sh;
}

}  // namespace

SimClass sim_class(Op op) { return row(op).cls; }

std::vector<int> sim_routing_counts(const PlanShape& s, int layer, uint64_t seed) {
  MD_REQUIRE(s.top_k >= 1 && s.top_k <= s.n_experts, "routing: top-k ", s.top_k, " of ", s.n_experts, " experts");
  SplitMix64 rng(mix64(seed) ^ mix64(static_cast<uint64_t>(layer) + 1));
  std::vector<int> count(s.n_experts, 0), ids(s.n_experts);
  for (int t = 0; t < s.batch; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int k = 0; k < s.top_k; ++k) {  // partial Fisher-Yates: k distinct experts
      std::swap(ids[k], ids[k + rng.below(s.n_experts - k)]);
      ++count[ids[k]];
    }
  }
  return count;
}

SimPlan sim_plan_from_plan(const Plan& plan, const SimParams& p) {
  const PlanShape& s = plan.params.shape;
  const CounterLayout& c = plan.params.counters;
  SimPlan sp;
  sp.n_sms = plan.n_sms();
  sp.n_counters = c.n_counters;
  std::vector<LayerRouting> routing;
  for (int L = 0; L < s.n_layers; ++L) routing.emplace_back(sim_routing_counts(s, L, p.routing_seed));
  sp.token_groups = token_groups(s.batch);
  GemmGeo geo[kNumGemmKinds];
  gemm_geometry(s, megakernel_layout(sp.token_groups), geo);
  sp.lists.resize(sp.n_sms);
  const int rows = std::min(s.batch, 8);  // row_us and routing_token_us: rows of one token group
  for (int sm = 0; sm < sp.n_sms; ++sm) {
    for (int32_t i = plan.list_begin[sm]; i < plan.list_begin[sm + 1]; ++i) {
      const Task& t = plan.tasks[i];
      const Op op = static_cast<Op>(t.op);
      SimTask st;
      st.op = op;
      st.layer = t.layer;
      st.cls = row(op).cls;
      for (int a = 0; a < t.n_arrives; ++a) st.arrives.push_back({t.arrive[a].counter, t.arrive[a].amount});
      const double us = p.op_us[static_cast<int>(op)];
      if (row(op).cls != SimClass::kAttention) st.pre_us = p.pre_wait_us[static_cast<int>(op)];
      switch (st.cls) {
        case SimClass::kGemm:
          st.bytes = row(op).amount(s, t);
          st.cost_us = us + p.row_us[static_cast<int>(op)] * (rows - 1);
          // A tile's row blocks are arg[0..1); a dense FFN share's are its moe_share of the MLP's up
          // units or down row blocks. The kernel walks both as one job over the range (ops.cuh
          // JobWalk) in its kGemmDenseUp / kGemmDenseDown geometry, refilling per window alike.
          if (op == Op::kDenseUp || op == Op::kDenseDown) {
            const MoeShare u = moe_share(op == Op::kDenseUp ? s.dense_units : s.down_rbs, t.arg[0], t.arg[1], t.arg[2]);
            st.cost_us += p.fill_us * static_cast<double>(tile_refills(geo[gemm_kind(op)], span(u.begin, u.end)));
          } else {
            st.cost_us += p.fill_us * static_cast<double>(tile_refills(geo[gemm_kind(op)], span(t.arg[0], t.arg[1])));
          }
          break;
        case SimClass::kTiny: st.cost_us = us * static_cast<double>(row(op).amount(s, t)); break;
        case SimClass::kRouted: {
          const Share sh = expert_share(s, geo, routing[t.layer], op, t);
          st.bytes = sh.bytes;
          st.cost_us = us + p.job_us * static_cast<double>(sh.jobs) + p.fill_us * static_cast<double>(sh.fills);
          if (op == Op::kExpertUp) {
            st.computes_routing = true;
            st.routing_rounds = (s.batch + 7) / 8;
            st.routing_rows = rows;
            // The whole-K fill before the router wait, after the O-proj wait (ops.cuh op_gemm); a
            // windowed share fills per window instead (counted above).
            // (Parallel blocks: after the previous layer's O-proj wait, none at layer 0.)
            st.pre_after_waits = s.parallel ? t.n_waits - 1 : 1;
            if (geo[kGemmUp].n_windows() > 1) st.pre_us = 0;
            else st.pre_us += p.row_us[static_cast<int>(op)] * (rows - 1);
          }
          break;
        }
        case SimClass::kAttention: {
          // The item waits for its QKV group itself (its first K/V chunks are already loading).
          SimItem item = attention_item(s, c, plan.attn_items[t.arg[0]], t.layer, p);
          for (int w = 0; w < t.n_waits; ++w) item.waits.push_back({t.wait[w].counter, t.wait[w].target});
          st.items.push_back(std::move(item));
          break;
        }
      }
      if (st.cls != SimClass::kAttention)
        for (int w = 0; w < t.n_waits; ++w) st.waits.push_back({t.wait[w].counter, t.wait[w].target});
      sp.lists[sm].push_back(std::move(st));
    }
  }
  return sp;
}

}  // namespace megadecode
