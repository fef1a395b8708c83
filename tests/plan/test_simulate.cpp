// The timing model (plan/simulate.h): hand-computable synthetic plans for each mechanism (one SM
// streaming, the ring limit, the HBM ceiling shared fairly, counter hops and polls, the v1
// producer stopping at drains vs the v2 loader with its L2 prefetch, split merges), random small
// plans, the calibration against the committed H200 trace, and the `plan --simulate` command.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/presets.h"
#include "plan/planner.h"
#include "plan/simulate.h"
#include "plan/simulate_plan.h"
#include "plan/simulate_report.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

constexpr int64_t kPage = 16384;

// Everything instant and unlimited; each test turns on what it measures.
SimParams ideal(SimLoader loader) {
  SimParams p;
  p.loader = loader;
  p.hbm_gbps = p.sm_stream_gbps = p.l2_gbps = 1e9;
  p.ring_pages = 1000;
  p.page_bytes = kPage;
  p.work_slots = 4;
  p.consume_gbps = 1e12;
  p.attention = {1, 0, true, true};
  return p;
}

SimTask task(SimClass cls, int64_t bytes, double cost_us, std::vector<SimWait> waits, std::vector<SimArrive> arrives) {
  SimTask t;
  t.op = cls == SimClass::kGemm ? Op::kQkv : Op::kMoeNorm;
  t.layer = 0;
  t.cls = cls;
  t.bytes = bytes;
  t.cost_us = cost_us;
  t.x_rows = 1;
  t.waits = std::move(waits);
  t.arrives = std::move(arrives);
  return t;
}
SimTask gemm(int64_t bytes, std::vector<SimWait> waits = {}, std::vector<SimArrive> arrives = {}) {
  return task(SimClass::kGemm, bytes, 0, std::move(waits), std::move(arrives));
}
SimTask tiny(double us, std::vector<SimWait> waits = {}, std::vector<SimArrive> arrives = {}) {
  return task(SimClass::kTiny, 0, us, std::move(waits), std::move(arrives));
}

SimPlan plan_of(std::vector<std::vector<SimTask>> lists, int n_counters = 4) {
  SimPlan p;
  p.n_sms = static_cast<int>(lists.size());
  p.n_counters = n_counters;
  p.lists = std::move(lists);
  return p;
}

// The work slices of one SM's consumers, in order (simulate() keeps each SM's slices together).
std::vector<WorkSlice> slices_of(const SimResult& r, const SimPlan& plan, int sm) {
  size_t begin = 0;
  for (int s = 0; s < sm; ++s) begin += plan.lists[s].size();
  return {r.slices.begin() + begin, r.slices.begin() + begin + plan.lists[sm].size()};
}

double us_for(int64_t bytes, double gbps) { return static_cast<double>(bytes) / (gbps * 1e3); }

const char* name(SimLoader l) { return l == SimLoader::kV1 ? "v1" : "v2"; }

TEST(Simulate, OneSmStreamsAtItsRate) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const int64_t bytes = 1 + static_cast<int64_t>(rng.below(40 * kPage));  // awkward: a partial last page
    const double rate = 1 + 99 * rng.unit(), latency = 5 * rng.unit();
    for (SimLoader loader : {SimLoader::kV1, SimLoader::kV2}) {
      SimParams p = ideal(loader);
      p.sm_stream_gbps = rate;
      p.hbm_latency_us = latency;
      const SimPlan plan = plan_of({{gemm(bytes)}});
      const SimResult r = simulate(plan, p);
      ASSERT_EQ(r.slices.size(), 1u);
      const double want = std::max(latency, us_for(bytes, rate));
      EXPECT_NEAR(r.slices[0].t1_us, want, 1e-6 * want) << "seed " << seed << " " << name(loader) << " bytes " << bytes;
      EXPECT_NEAR(r.step_us, want, 1e-6 * want);
      EXPECT_EQ(r.hbm_bytes, bytes);
      EXPECT_NEAR(r.busy_frac, 1.0, 1e-9);
    }
  }
}

// With k ring slots and a latency L far above the service time, pages come k per L.
TEST(Simulate, RingSlotsLimitTheRateToRingOverLatency) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const int slots = 1 + static_cast<int>(rng.below(6)), pages = 1 + static_cast<int>(rng.below(30));
    const double latency = 0.5 + 2.5 * rng.unit();
    for (SimLoader loader : {SimLoader::kV1, SimLoader::kV2}) {
      SimParams p = ideal(loader);
      p.ring_pages = slots;
      p.hbm_latency_us = latency;
      const SimResult r = simulate(plan_of({{gemm(pages * kPage)}}), p);
      EXPECT_NEAR(r.step_us, ((pages + slots - 1) / slots) * latency, 1e-5)
          << "seed " << seed << " " << name(loader) << " slots " << slots << " pages " << pages;
    }
  }
}

TEST(Simulate, HbmCeilingIsSharedFairlyAmongStreamingSms) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int round = 0; round < 10; ++round) {
    const int n_sms = 2 + static_cast<int>(rng.below(7));
    const int64_t bytes = (1 + rng.below(20)) * kPage;
    const double cap = 10 + 40 * rng.unit(), ceiling = cap * n_sms * (0.1 + 0.8 * rng.unit());
    SimParams p = ideal(SimLoader::kV2);
    p.sm_stream_gbps = cap;
    p.hbm_gbps = ceiling;
    const SimResult r = simulate(plan_of(std::vector<std::vector<SimTask>>(n_sms, {gemm(bytes)})), p);
    const double want = us_for(bytes * n_sms, ceiling);
    for (const WorkSlice& w : r.slices) EXPECT_NEAR(w.t1_us, want, 1e-6 * want) << "seed " << seed;
  }
  // Unequal streams, ceiling = one SM's cap: half each until the short one ends at 2N/C, then the
  // long one alone at C: 3N/C.
  SimParams p = ideal(SimLoader::kV1);
  p.sm_stream_gbps = p.hbm_gbps = 20;
  const int64_t n = 7 * kPage;
  const SimPlan plan = plan_of({{gemm(2 * n)}, {gemm(n)}});
  const SimResult r = simulate(plan, p);
  EXPECT_NEAR(slices_of(r, plan, 1)[0].t1_us, 2 * us_for(n, 20), 1e-6);
  EXPECT_NEAR(slices_of(r, plan, 0)[0].t1_us, 3 * us_for(n, 20), 1e-6);
}

// SM 1 waits for SM 0's arrival: it starts hop_us later, at its next poll.
TEST(Simulate, CounterWaitAddsTheHopAndThePoll) {
  const int64_t bytes = 9 * kPage;
  for (SimLoader loader : {SimLoader::kV1, SimLoader::kV2})
    for (double poll : {0.0, 0.3}) {
      SimParams p = ideal(loader);
      p.sm_stream_gbps = 25;
      p.hop_us = 0.7;
      p.poll_us = poll;
      const SimPlan plan = plan_of({{gemm(bytes, {}, {{0, 1}})}, {tiny(2.0, {{0, 1}})}});
      const SimResult r = simulate(plan, p);
      const double arrival = us_for(bytes, 25), visible = arrival + 0.7;
      const double seen = poll > 0 ? std::ceil(visible / poll) * poll : visible;  // SM 1 polls from t = 0
      const WorkSlice w = slices_of(r, plan, 1)[0];
      EXPECT_NEAR(w.t0_us, seen, 1e-6) << name(loader) << " poll " << poll;
      EXPECT_NEAR(w.t1_us, seen + 2.0, 1e-6);
      EXPECT_NEAR(r.sms[1].wait_us, seen, 1e-6);  // idle, polling, until then
    }
}

// The routing gap. SM 1 runs a 20 us task, then arrives A. SM 0 needs A for its routed work (one
// item of B bytes), then streams a static GEMM of N bytes. HBM 10 GB/s, everything else instant.
struct RoutedCase {
  static constexpr double kT0 = 20, kHop = 0.5, kRouting = 1.0, kHbm = 10;
  static constexpr int64_t kB = 2 * kPage, kN = 5 * kPage;
  static SimParams params(SimLoader loader) {
    SimParams p = ideal(loader);
    p.hbm_gbps = kHbm;
    p.hop_us = kHop;
    p.routing_us = kRouting;
    return p;
  }
  static SimItem item() {
    SimItem it;
    it.bytes = kB;
    it.x_rows = 1;
    return it;
  }
};

TEST(Simulate, V2LoaderPrefetchesIntoL2DuringTheRoutingGap) {
  for (int64_t budget : {int64_t{0}, RoutedCase::kN}) {
    SimParams p = RoutedCase::params(SimLoader::kV2);
    p.l2_ahead_bytes = budget;
    SimTask routed;
    routed.op = Op::kExpertUp;
    routed.layer = 0;
    routed.cls = SimClass::kRouted;
    routed.computes_routing = true;
    routed.waits = {{0, 1}};
    routed.items = {RoutedCase::item()};
    const SimPlan plan = plan_of({{routed, gemm(RoutedCase::kN)}, {tiny(RoutedCase::kT0, {}, {{0, 1}})}});
    const SimResult r = simulate(plan, p);
    const double gate = RoutedCase::kT0 + RoutedCase::kHop + RoutedCase::kRouting;  // routing known on SM 0
    const auto sm0 = slices_of(r, plan, 0);
    EXPECT_NEAR(sm0[0].t0_us, gate, 1e-6);
    EXPECT_NEAR(sm0[0].t1_us, gate + us_for(RoutedCase::kB, RoutedCase::kHbm), 1e-6);
    // With the budget, the GEMM's bytes went to L2 during the gap and now cost (almost) nothing.
    const int64_t after = budget > 0 ? RoutedCase::kB : RoutedCase::kB + RoutedCase::kN;
    EXPECT_NEAR(sm0[1].t1_us, gate + us_for(after, RoutedCase::kHbm), 1e-3) << "budget " << budget;
    EXPECT_EQ(r.l2_bytes, budget);
    EXPECT_EQ(r.hbm_bytes, RoutedCase::kB + RoutedCase::kN);  // the L2 prefetch read them once
  }
}

TEST(Simulate, V1ProducerPrefetchesDuringWaitsButNotPastAnExpertDrain) {
  const SimParams p = RoutedCase::params(SimLoader::kV1);
  SimQueue q;
  q.items = {RoutedCase::item()};
  q.weights_before_wait = true;
  SimTask drain;
  drain.op = Op::kExpertUp;
  drain.layer = 0;
  drain.cls = SimClass::kRouted;
  drain.queue = 0;
  const double seen = RoutedCase::kT0 + RoutedCase::kHop;
  {  // [wait A, drain, GEMM]: nothing streams before A; then the item and the GEMM back to back.
    SimPlan plan = plan_of({{tiny(0, {{0, 1}}), drain, gemm(RoutedCase::kN)}, {tiny(RoutedCase::kT0, {}, {{0, 1}})}});
    plan.queues = {q};
    const SimResult r = simulate(plan, p);
    const auto sm0 = slices_of(r, plan, 0);
    EXPECT_NEAR(sm0[1].t1_us, seen + us_for(RoutedCase::kB, RoutedCase::kHbm), 1e-6);
    EXPECT_NEAR(sm0[2].t1_us, seen + us_for(RoutedCase::kB + RoutedCase::kN, RoutedCase::kHbm), 1e-6);
  }
  {  // [wait A, GEMM, drain]: the GEMM's pages stream during the wait and are consumed at once.
    SimPlan plan = plan_of({{tiny(0, {{0, 1}}), gemm(RoutedCase::kN), drain}, {tiny(RoutedCase::kT0, {}, {{0, 1}})}});
    plan.queues = {q};
    const SimResult r = simulate(plan, p);
    const auto sm0 = slices_of(r, plan, 0);
    EXPECT_NEAR(sm0[1].t1_us, seen, 1e-6);
    EXPECT_NEAR(sm0[2].t1_us, seen + us_for(RoutedCase::kB, RoutedCase::kHbm), 1e-6);
  }
}

// The v2 loader streams a GEMM's pages before its wait is satisfied, but its work record needs a
// free slot: the consumers free one when they take a record, so with one slot the GEMM behind a
// 2 us task and an empty one is posted (and streamed) only when the empty one is taken.
TEST(Simulate, V2LoaderIgnoresWaitsAndRunsAheadByWorkSlots) {
  const int64_t n = 6 * kPage;
  for (int slots : {1, 2}) {
    SimParams p = ideal(SimLoader::kV2);
    p.hbm_gbps = 20;
    p.hop_us = 0.5;
    p.work_slots = slots;
    const SimPlan plan = plan_of({{tiny(2), tiny(0), gemm(n, {{0, 1}})}, {tiny(3, {}, {{0, 1}})}});
    const SimResult r = simulate(plan, p);
    const double streamed = (slots == 1 ? 2 : 0) + us_for(n, 20);  // 4.9152 us of HBM
    EXPECT_NEAR(slices_of(r, plan, 0)[2].t1_us, std::max(3.5, streamed), 1e-6) << "slots " << slots;
  }
}

// Two splits of one attention row on two SMs: the later arriver merges, then the merge's counter
// lets SM 0's next task go.
TEST(Simulate, LastArrivingSplitMergesAndArrives) {
  SimParams p = ideal(SimLoader::kV1);
  SimQueue q;
  q.one_at_a_time = q.consumer_waits = true;
  for (int i = 0; i < 2; ++i) {
    SimItem it;
    it.cost_us = 5 + i;  // item 1 ends last
    it.split_counter = 1;
    it.n_splits = 2;
    it.merge_us = 3;
    it.merge_arrives = {{2, 1}};
    q.items.push_back(it);
  }
  SimTask attn;
  attn.op = Op::kAttn;
  attn.layer = 0;
  attn.cls = SimClass::kAttention;
  attn.queue = 0;
  SimPlan plan = plan_of({{attn, tiny(1, {{2, 1}})}, {attn}});
  plan.queues = {q};
  const SimResult r = simulate(plan, p);
  std::vector<double> ends;
  for (const WorkSlice& w : r.slices)
    if (w.op == static_cast<int>(Op::kAttn)) ends.push_back(w.t1_us);
  std::sort(ends.begin(), ends.end());
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_NEAR(ends[0], 5, 1e-9);
  EXPECT_NEAR(ends[1], 6 + 3, 1e-9);
  EXPECT_NEAR(slices_of(r, plan, 0).back().t0_us, 9, 1e-9);
}

TEST(Simulate, DeadlocksAndBadInputAreErrors) {
  const SimParams p = ideal(SimLoader::kV2);
  try {
    simulate(plan_of({{tiny(1, {{3, 1}})}}), p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
  EXPECT_THROW(simulate(plan_of({{tiny(1, {{9, 1}})}}), p), Error);  // counter out of range
  SimParams bad = p;
  bad.ring_pages = 0;
  EXPECT_THROW(simulate(plan_of({{tiny(1)}}), bad), Error);
  bad = p;
  bad.hbm_gbps = 0;
  EXPECT_THROW(simulate(plan_of({{tiny(1)}}), bad), Error);
  SimPlan drains = plan_of({{tiny(1)}});
  drains.lists[0][0].queue = 0;
  drains.queues.resize(1);
  EXPECT_THROW(simulate(drains, p), Error);  // v2 runs no queues
}

TEST(Simulate, ParamsJsonRoundTripsAndRejectsUnknownKeys) {
  const SimParams p = v1_h200_params(true);
  const nlohmann::json j = sim_params_json(p);
  EXPECT_EQ(sim_params_json(sim_params_from_json(j, SimParams{})), j);
  const SimParams q = sim_params_from_json({{"hop_us", 2.5}, {"loader", "v2"}, {"op_us", {{"qkv", 1.5}}}}, p);
  EXPECT_EQ(q.hop_us, 2.5);
  EXPECT_EQ(q.loader, SimLoader::kV2);
  EXPECT_EQ(q.op_us[static_cast<int>(Op::kQkv)], 1.5);
  EXPECT_EQ(q.op_us[static_cast<int>(Op::kOProj)], p.op_us[static_cast<int>(Op::kOProj)]);
  EXPECT_THROW(sim_params_from_json({{"hop", 1}}, p), Error);
  EXPECT_THROW(sim_params_from_json({{"op_us", {{"qkvv", 1}}}}, p), Error);
  EXPECT_THROW(sim_params_from_json({{"hop_us", "fast"}}, p), Error);
  EXPECT_THROW(sim_params_from_json({{"loader", "v3"}}, p), Error);
  EXPECT_THROW(sim_params_from_json({{"attention", {{"kv", 1}}}}, p), Error);
}

TEST(Simulate, RoutingPicksDistinctExpertsPerToken) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  PlanShape s{};
  s.batch = 1 + static_cast<int>(rng.below(64));
  s.n_experts = 4 + static_cast<int>(rng.below(200));
  s.top_k = 1 + static_cast<int>(rng.below(std::min(8, s.n_experts)));
  const std::vector<int> a = sim_routing_counts(s, 3, seed), b = sim_routing_counts(s, 3, seed);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::accumulate(a.begin(), a.end(), 0), s.batch * s.top_k) << "seed " << seed;
  for (int c : a) EXPECT_LE(c, s.batch);  // distinct experts per token
  s.top_k = s.n_experts + 1;
  EXPECT_THROW(sim_routing_counts(s, 0, seed), Error);
}

// Random small plans of every policy simulate to the end, with one work slice per static task,
// attention item and expert item.
TEST(Simulate, RandomSmallPlansRunEveryTaskAndItem) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int round = 0; round < 12; ++round) {
    const ModelConfig c = test::random_config(rng);
    const std::string policy = policy_names()[rng.below(policy_names().size())];
    const Policy pol = test::random_policy(rng, policy);
    const test::RandomBatch rb = test::random_batch(rng, 1 + static_cast<int>(rng.below(5)), 200, 16);
    PlanOptions opt;
    opt.n_sms = 1 + static_cast<int>(rng.below(9));
    const Plan plan = make_plan(c, rb.state, pol, opt);
    const SimParams p = v1_h200_params(rng.below(2) == 0);
    const SimResult r = simulate_plan(plan, p);
    const PlanShape& s = plan.params.shape;
    size_t want = static_cast<size_t>(s.n_attn_items) * s.n_layers;
    for (const Task& t : plan.tasks) want += op_is_drain(static_cast<Op>(t.op)) ? 0 : 1;
    for (int l = 0; l < s.n_layers; ++l) {
      const std::vector<int> count = sim_routing_counts(s, l, p.routing_seed);
      want += (s.up_blocks + s.down_blocks) * std::count_if(count.begin(), count.end(), [](int n) { return n > 0; });
    }
    EXPECT_EQ(r.slices.size(), want) << "seed " << seed << " round " << round << " policy " << policy;
    EXPECT_GT(r.step_us, 0);
    for (const WorkSlice& w : r.slices) EXPECT_GE(w.t1_us, w.t0_us);
  }
}

std::string results_file(const std::string& name) { return std::string(MEGADECODE_SOURCE_DIR) + "/bench/results/" + name; }

Plan full_plan_b1(int context) {
  static std::vector<int32_t> table;
  table.resize((context + 15) / 16);
  std::iota(table.begin(), table.end(), 0);
  BatchState b;
  b.kv_block_size = 16;
  b.seqs.push_back({context, table});
  return make_plan(preset_config("qwen3-30b-a3b"), b, policy_by_name("default"));
}

// The calibration: v1 with tensor-core attention at batch 1, context 8192 on the H200 (the trace
// of bench/results). Every op wave's start and end inside the layer, and the layer, within 20 %.
TEST(SimulateCalibration, ReproducesTheV1TcTimelineWithin20Percent) {
  const MeasuredTimeline m = read_measured_timeline(results_file("timeline-cuda-mk-tc-b1-ctx8192.json"));
  ASSERT_EQ(m.timeline.waves.size(), 9u);
  const SimResult r = simulate_plan(full_plan_b1(8192), v1_h200_params(true));
  const TimelineComparison c = compare_timelines(r, m);
  std::printf("%s", format_simulation(r, &c).c_str());
  for (const WaveError& e : c.waves) {
    EXPECT_FALSE(e.missing) << e.op;
    EXPECT_LE(std::abs(e.start_err_pct), 20.0) << e.op << " start";
    EXPECT_LE(std::abs(e.end_err_pct), 20.0) << e.op << " end";
  }
  EXPECT_LE(std::abs(c.layer_err_pct), 20.0);
  EXPECT_LE(std::abs(c.step_err_pct), 20.0);
}

// The second point: the scalar attention kernel with the same parameters (only the attention
// item's cost and the ring differ). Its single-CTA norm was faster in that build, so only the
// layer and the step are held to 20 %.
TEST(SimulateCalibration, PredictsTheScalarKernelsLayer) {
  const MeasuredTimeline m = read_measured_timeline(results_file("timeline-cuda-mk-scalar-b1-ctx8192.json"));
  const TimelineComparison c = compare_timelines(simulate_plan(full_plan_b1(8192), v1_h200_params(false)), m);
  EXPECT_LE(std::abs(c.layer_err_pct), 20.0);
  EXPECT_LE(std::abs(c.step_err_pct), 20.0);
}

TEST(SimulateCalibration, ReadsTheCommittedTraceLikeItsTimeline) {
  MeasuredTimeline gz;
  try {
    gz = read_measured_timeline(results_file("trace-cuda-mk-tc-b1-ctx8192.json.gz"));
  } catch (const Error& e) {
    if (std::string(e.what()).find("no zlib") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  const MeasuredTimeline plain = read_measured_timeline(results_file("timeline-cuda-mk-tc-b1-ctx8192.json"));
  EXPECT_EQ(wave_timings_json(gz.timeline.waves), wave_timings_json(plain.timeline.waves));
  EXPECT_EQ(gz.timeline.layer_us, plain.timeline.layer_us);
  EXPECT_EQ(gz.meta["attention"], "tc");
}

using test::run_plan;

TEST(SimulateCommand, PrintsAndComparesTheTimeline) {
  const std::vector<std::string> base = {"--preset", "qwen3-30b-a3b", "--batch", "1", "--context", "8192", "--simulate",
                                         "--attention", "tc", "--trace", results_file("timeline-cuda-mk-tc-b1-ctx8192.json")};
  std::vector<std::string> json_args = base;
  json_args.push_back("--json");
  const nlohmann::json j = nlohmann::json::parse(run_plan(json_args));
  EXPECT_EQ(j["n_layers"], 48);
  const nlohmann::json& sim = j["simulation"];
  EXPECT_GT(sim["step_us"].get<double>(), 0);
  EXPECT_EQ(sim["layer_timeline"].size(), 9u);
  EXPECT_EQ(sim["sm_busy_us"].size(), 132u);
  EXPECT_LE(sim["comparison"]["worst_abs_pct"].get<double>(), 20.0);
  EXPECT_EQ(sim["params"]["ring_pages"], 5);
  const std::string text = run_plan(base);
  for (const char* want : {"simulated step", "one layer", "measured vs simulated", "expert_down"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " missing from:\n" << text;

  const auto dir = std::filesystem::temp_directory_path() / ("md_sim_cmd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "p.json") << R"({"hop_us": 3.0, "op_us": {"attn_norm": 1.0}})";
  std::ofstream(dir / "bad.json") << R"({"hop_microseconds": 3.0})";
  const nlohmann::json k = nlohmann::json::parse(run_plan({"--preset", "small", "--context", "300", "--simulate",
                                                           "--sim-params", (dir / "p.json").string(), "--json"}));
  EXPECT_EQ(k["simulation"]["params"]["hop_us"], 3.0);
  EXPECT_EQ(k["simulation"]["params"]["op_us"]["attn_norm"], 1.0);
  EXPECT_FALSE(k["simulation"].contains("comparison"));
  EXPECT_THROW(run_plan({"--preset", "small", "--simulate", "--sim-params", (dir / "bad.json").string()}), Error);
  EXPECT_THROW(run_plan({"--preset", "small", "--simulate", "--sim-params", (dir / "missing.json").string()}), Error);
  EXPECT_THROW(run_plan({"--preset", "small", "--simulate", "--trace", (dir / "p.json").string()}), Error);
  EXPECT_THROW(run_plan({"--preset", "small", "--trace", (dir / "p.json").string()}), Error);  // needs --simulate
  EXPECT_THROW(run_plan({"--preset", "small", "--simulate", "--attention", "fast"}), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megadecode
