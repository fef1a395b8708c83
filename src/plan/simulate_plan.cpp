// Plan -> SimPlan (simulate_plan.h): the op table, task costs and bytes, and the v1 drain queues
// (attention items from the plan, expert items from the simulated routing).
#include "plan/simulate_plan.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"

namespace megadecode {
namespace {

int64_t span(int32_t a, int32_t b) { return std::max<int64_t>(0, static_cast<int64_t>(b) - a); }
// bf16 weight bytes of a GEMM tile: rows x K x 2 (task.h gives each op's row range).
int64_t qkv_bytes(const PlanShape& s, const Task& t) { return span(t.arg[1], t.arg[2]) * s.hidden * 2; }
int64_t oproj_bytes(const PlanShape& s, const Task& t) {
  return span(t.arg[1], t.arg[2]) * s.group_size * s.head_dim * 2;
}
int64_t rows_x_hidden(const PlanShape& s, const Task& t) { return span(t.arg[0], t.arg[1]) * s.hidden * 2; }
// Tokens of a single-CTA task (its token range), which its per-token cost multiplies.
int64_t task_tokens(const PlanShape&, const Task& t) { return span(t.arg[0], t.arg[1]); }
// DISPATCH runs the top-k of one token per consumer warp (8 warps): rounds of 8 tokens.
int64_t dispatch_rounds(const PlanShape& s, const Task&) { return (s.batch + 7) / 8; }

// THE op table: every op's class and its amount (GEMM: weight bytes of the task; single-CTA ops:
// tokens, or rounds of tokens, which op_us multiplies; drains: none, their items carry amounts).
// New ops (v2) are mapped here and nowhere else.
struct SimOpRow {
  Op op;
  SimClass cls;
  int64_t (*amount)(const PlanShape&, const Task&);
};
constexpr SimOpRow kSimOps[] = {
    {Op::kAttnNorm, SimClass::kTiny, task_tokens},   {Op::kQkv, SimClass::kGemm, qkv_bytes},
    {Op::kAttn, SimClass::kAttention, nullptr},      {Op::kOProj, SimClass::kGemm, oproj_bytes},
    {Op::kMoeNorm, SimClass::kTiny, task_tokens},    {Op::kRouter, SimClass::kGemm, rows_x_hidden},
    {Op::kDispatch, SimClass::kTiny, dispatch_rounds},  {Op::kExpertUp, SimClass::kRouted, nullptr},
    {Op::kExpertDown, SimClass::kRouted, nullptr},   {Op::kFinalNorm, SimClass::kTiny, task_tokens},
    {Op::kLmHead, SimClass::kGemm, rows_x_hidden},   {Op::kSample, SimClass::kTiny, task_tokens},
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
  item.cost_us = p.op_us[static_cast<int>(Op::kAttn)] + us_for(kv_bytes, p.attention.kv_gbps);
  item.waits.push_back({layer_counter(c, layer, c.qkv_done + it.group), s.qkv_tiles_per_group});
  item.split_counter = layer_counter(c, layer, c.attn_split + it.seq * s.n_kv_heads + it.group);
  item.n_splits = it.n_splits;
  item.merge_us = p.attention.merge_us_per_split * it.n_splits;
  item.merge_arrives.push_back({layer_counter(c, layer, c.attn_done + it.group), 1});
  return item;
}

// What DISPATCH builds for a layer (mk_ops.cuh op_dispatch): items expert-major over the active
// experts in ascending order; and its credits for the inactive ones (task.h).
void expert_queues(const PlanShape& s, const CounterLayout& c, int layer, const SimParams& p, SimQueue& up,
                   SimQueue& down, std::vector<SimArrive>& credits) {
  const std::vector<int> count = sim_routing_counts(s, layer, p.routing_seed);
  int n_active = 0;
  for (int e = 0; e < s.n_experts; ++e) {
    if (count[e] == 0) {
      credits.push_back({layer_counter(c, layer, c.up_done + e), s.up_blocks});
      continue;
    }
    ++n_active;
    for (int b = 0; b < s.up_blocks; ++b) {
      SimItem item;
      item.bytes = 2 * span(b * s.up_cols, std::min(s.moe_inter, (b + 1) * s.up_cols)) * s.hidden * 2;
      item.cost_us = p.op_us[static_cast<int>(Op::kExpertUp)];
      item.x_rows = count[e];
      item.gathered = true;  // issue_activations reads each token's row index first
      item.arrives.push_back({layer_counter(c, layer, c.up_done + e), 1});
      up.items.push_back(item);
    }
  }
  for (int e = 0; e < s.n_experts; ++e) {
    if (count[e] == 0) continue;
    for (int b = 0; b < s.down_blocks; ++b) {
      SimItem item;
      item.bytes = span(b * s.down_rows, std::min(s.hidden, (b + 1) * s.down_rows)) * s.moe_inter * 2;
      item.cost_us = p.op_us[static_cast<int>(Op::kExpertDown)];
      item.x_rows = count[e];
      item.waits.push_back({layer_counter(c, layer, c.up_done + e), s.up_blocks});
      item.arrives.push_back({layer_counter(c, layer, c.down_done), 1});
      down.items.push_back(item);
    }
  }
  if (n_active < s.n_experts)
    credits.push_back({layer_counter(c, layer, c.down_done), (s.n_experts - n_active) * s.down_blocks});
  for (SimQueue* q : {&up, &down}) {
    q->claim_round_trips = 3;  // the claim atomic, the item, then its expert's offset and count
    q->prologue_round_trips = 1;  // the layer's item count
    q->weights_before_wait = true;
  }
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
  std::vector<std::vector<SimArrive>> credits(s.n_layers);
  std::vector<SimQueue> down(s.n_layers);  // built with the layer's up queue, which comes first
  for (const QueueInfo& qi : plan.queues) {
    SimQueue q;
    if (qi.op == Op::kAttn) {
      for (const AttnItem& it : plan.attn_items) q.items.push_back(attention_item(s, c, it, qi.layer, p));
      q.claim_round_trips = 2;  // the claim atomic, then the item record
      q.one_at_a_time = p.attention.one_at_a_time;
      q.consumer_waits = p.attention.consumer_waits;
    } else if (qi.op == Op::kExpertUp) {
      expert_queues(s, c, qi.layer, p, q, down[qi.layer], credits[qi.layer]);
    } else {
      MD_CHECK(qi.op == Op::kExpertDown, "queue of op ", op_name(qi.op));
      q = std::move(down[qi.layer]);
    }
    sp.queues.push_back(std::move(q));
  }
  sp.lists.resize(sp.n_sms);
  for (int sm = 0; sm < sp.n_sms; ++sm) {
    for (int32_t i = plan.list_begin[sm]; i < plan.list_begin[sm + 1]; ++i) {
      const Task& t = plan.tasks[i];
      const Op op = static_cast<Op>(t.op);
      SimTask st;
      st.op = op;
      st.layer = t.layer;
      st.cls = row(op).cls;
      for (int w = 0; w < t.n_waits; ++w) st.waits.push_back({t.wait[w].counter, t.wait[w].target});
      for (int a = 0; a < t.n_arrives; ++a) st.arrives.push_back({t.arrive[a].counter, t.arrive[a].amount});
      const double us = p.op_us[static_cast<int>(op)];
      if (st.cls == SimClass::kGemm) {
        st.bytes = row(op).amount(s, t);
        st.cost_us = us;
        st.x_rows = s.batch;
      } else if (st.cls == SimClass::kTiny) {
        st.cost_us = us * static_cast<double>(row(op).amount(s, t));
      } else {
        for (size_t q = 0; q < plan.queues.size() && st.queue < 0; ++q)
          if (plan.queues[q].op == op && plan.queues[q].layer == t.layer) st.queue = static_cast<int>(q);
        MD_REQUIRE(st.queue >= 0, "simulate: no queue for the ", op_name(op), " drain of layer ", t.layer);
      }
      if (op == Op::kDispatch && t.layer >= 0)
        st.arrives.insert(st.arrives.end(), credits[t.layer].begin(), credits[t.layer].end());
      sp.lists[sm].push_back(std::move(st));
    }
  }
  return sp;
}

}  // namespace megadecode
