// simulate(): checks the parameters, runs one step's agents on the engine and summarises the
// result (step time, busy / counter-wait fractions per SM, the per-layer timeline); and the parts
// of the consumers that every task class shares.
#include "plan/simulate.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "plan/simulate_agents.h"
#include "plan/simulate_plan.h"

namespace megadecode {
namespace sim {

Step::Step(const SimPlan& plan, const SimParams& params) : e(plan, params), sms(plan.n_sms) {
  int n_layers = 0;
  for (const auto& list : plan.lists)
    for (const SimTask& t : list) n_layers = std::max(n_layers, t.layer + 1);
  for (int sm = 0; sm < plan.n_sms; ++sm) {
    SmState& s = sms[sm];
    s.sm = s.loader.sm = s.consumer.sm = sm;
    s.routed.assign(n_layers, 0);
    s.l2_ahead.assign(plan.lists[sm].size(), 0);
  }
}

void arrive_all(Step& st, const std::vector<SimArrive>& arrives) {
  for (const SimArrive& a : arrives) st.e.arrive(a.counter, a.amount);
}

Co consume(Step& st, SmState& s, int64_t bytes) {
  const int64_t page = st.e.params.page_bytes;
  for (int64_t k = 0, n = n_pages(bytes, page); k < n; ++k) {
    const int64_t seq = s.consumed++;
    while (st.e.landed(s.sm, seq) > st.e.now()) {
      st.e.on_landed(s.sm, seq, s.consumer);
      co_await st.e.block(s.consumer, "a page to land");
    }
    co_await st.e.delay(s.consumer, static_cast<double>(page_size(bytes, page, k)) * st.e.plan.token_groups /
                                        (st.e.params.consume_gbps * 1e3));
    st.e.release(s.sm, seq);
  }
}

Co run_item(Step& st, SmState& s, const SimItem& item) {
  co_await st.e.delay(s.consumer, item.cost_us);
  co_await consume(st, s, item.bytes);
  arrive_all(st, item.arrives);
  if (item.split_counter >= 0 && st.e.arrive(item.split_counter, 1) == item.n_splits) {
    co_await st.e.delay(s.consumer, item.merge_us);  // the last arriver merges the splits
    arrive_all(st, item.merge_arrives);
  }
}

namespace {

void check_params(const SimParams& p) {
  MD_REQUIRE(p.hbm_gbps > 0 && p.sm_stream_gbps > 0 && p.l2_gbps > 0 && p.consume_gbps > 0,
             "simulate: bandwidths must be > 0 (hbm_gbps, sm_stream_gbps, l2_gbps, consume_gbps)");
  MD_REQUIRE(p.hbm_latency_us >= 0 && p.l2_latency_us >= 0 && p.hop_us >= 0 && p.poll_us >= 0 && p.routing_us >= 0 &&
                 p.pickup_us >= 0 && p.wait_jitter_us >= 0 && p.fill_us >= 0 && p.job_us >= 0 &&
                 p.routing_token_us >= 0,
             "simulate: latencies must be >= 0");
  MD_REQUIRE(p.ring_pages >= 1 && p.page_bytes >= 1 && p.l2_ahead_bytes >= 0,
             "simulate: ring_pages and page_bytes must be >= 1, l2_ahead_bytes >= 0");
  MD_REQUIRE(p.attention.kv_gbps > 0 && p.attention.merge_us_per_split >= 0, "simulate: bad attention parameters");
  for (int i = 0; i < kNumOps; ++i)
    MD_REQUIRE(std::isfinite(p.op_us[i]) && p.op_us[i] >= 0 && std::isfinite(p.pre_wait_us[i]) && p.pre_wait_us[i] >= 0 &&
                   std::isfinite(p.row_us[i]) && p.row_us[i] >= 0,
               "simulate: op costs of ", op_name(static_cast<Op>(i)), " must be >= 0");
}

void check_plan(const SimPlan& plan) {
  MD_REQUIRE(plan.n_sms >= 1 && static_cast<int>(plan.lists.size()) == plan.n_sms, "simulate: plan has ",
             plan.lists.size(), " task lists for ", plan.n_sms, " SMs");
  MD_REQUIRE(plan.token_groups >= 1, "simulate: ", plan.token_groups, " token groups");
  for (int sm = 0; sm < plan.n_sms; ++sm) {
    std::vector<char> routed;  // [layer]
    for (const SimTask& t : plan.lists[sm]) {
      MD_REQUIRE(t.layer >= 0 || !t.computes_routing, "simulate: routing is per layer");
      if (t.cls != SimClass::kRouted) continue;
      if (t.layer >= static_cast<int>(routed.size())) routed.resize(t.layer + 1, 0);
      // The loader computes a layer's routing at the layer's first routed task (after its last wait).
      MD_REQUIRE(routed[t.layer] || (t.computes_routing && !t.waits.empty()), "simulate: SM ", sm,
                 " has a routed share of layer ", t.layer, " before a share that computes the layer's routing after a wait");
      routed[t.layer] = 1;
    }
  }
}

// SM time in the gaps between work slices during which its waiter polled a counter.
double wait_in_gaps(const std::vector<WorkSlice>& slices, const std::vector<std::pair<double, double>>& waits, double t0) {
  std::vector<std::pair<double, double>> gaps;
  double prev = t0;
  for (const WorkSlice& w : slices) {
    if (w.t0_us > prev) gaps.push_back({prev, w.t0_us});
    prev = std::max(prev, w.t1_us);
  }
  double sum = 0;
  for (const auto& [a, b] : waits)
    for (const auto& [g0, g1] : gaps) sum += std::max(0.0, std::min(b, g1) - std::max(a, g0));
  return sum;
}

}  // namespace
}  // namespace sim

SimResult simulate(const SimPlan& plan, const SimParams& params) {
  sim::check_params(params);
  sim::check_plan(plan);
  sim::Step st(plan, params);
  std::vector<sim::Co> tops;
  std::vector<sim::Agent*> agents;
  int64_t work = 0;
  for (sim::SmState& s : st.sms) {
    tops.push_back(sim::loader(st, s));
    tops.push_back(sim::consumer(st, s));
    agents.push_back(&s.loader);
    agents.push_back(&s.consumer);
    for (const SimTask& t : plan.lists[s.sm])
      work += 1 + sim::n_pages(t.bytes, params.page_bytes) + static_cast<int64_t>(t.items.size());
  }
  SimResult r;
  r.events = st.e.run(tops, agents, 64 * work + 1000000);

  double t0 = sim::kNever, t1 = -sim::kNever;
  for (const sim::SmState& s : st.sms)
    for (const WorkSlice& w : s.slices) {
      t0 = std::min(t0, w.t0_us);
      t1 = std::max(t1, w.t1_us);
    }
  if (t0 > t1) t0 = t1 = 0;
  r.step_us = t1 - t0;
  double busy = 0, wait = 0;
  for (sim::SmState& s : st.sms) {
    std::sort(s.slices.begin(), s.slices.end(), [](const WorkSlice& a, const WorkSlice& b) { return a.t0_us < b.t0_us; });
    SimSmTime sm;
    for (const WorkSlice& w : s.slices) sm.busy_us += w.t1_us - w.t0_us;
    sm.wait_us = sim::wait_in_gaps(s.slices, s.waits, t0);
    busy += sm.busy_us;
    wait += sm.wait_us;
    r.sms.push_back(sm);
    r.slices.insert(r.slices.end(), s.slices.begin(), s.slices.end());
  }
  const double sm_time = r.step_us * plan.n_sms;
  if (sm_time > 0) {
    r.busy_frac = busy / sm_time;
    r.wait_frac = wait / sm_time;
    r.idle_frac = std::max(0.0, 1.0 - r.busy_frac - r.wait_frac);
  }
  r.timeline = layer_timeline(r.slices);
  r.hbm_bytes = st.e.hbm_bytes();
  r.l2_bytes = st.e.l2_bytes();
  return r;
}

SimResult simulate_plan(const Plan& plan, const SimParams& params) {
  return simulate(sim_plan_from_plan(plan, params), params);
}

}  // namespace megadecode
