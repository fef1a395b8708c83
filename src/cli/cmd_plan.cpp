// `megadecode plan`: builds and validates the decode plan for a model shape and batch without
// loading weights (--preset uses the built-in shapes, --model reads only config.json), then prints
// its statistics: tasks per op and per SM, counters, attention items, the critical path. With --simulate it
// also predicts the step's timing (plan/simulate.h), and with --trace compares it with a measurement.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "cli/commands.h"
#include "core/args.h"
#include "core/check.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/presets.h"
#include "plan/planner.h"
#include "plan/simulate_report.h"
#include "plan/stats.h"
#include "plan/validator.h"

namespace megadecode {
namespace {

// --simulate: the statistics plus the predicted timing, and with --trace the error per op wave.
int simulate_and_print(const Args& args, const Plan& plan, const PlanStats& stats) {
  SimParams params = sim_params_for_gpu(args.get("gpu", "h200"));
  if (args.has("sim-params")) params = read_sim_params(args.require("sim-params"), params);
  const SimResult sim = simulate_plan(plan, params);
  std::optional<TimelineComparison> cmp;
  if (args.has("trace")) {
    const MeasuredTimeline m = read_measured_timeline(args.require("trace"));
    const nlohmann::json want = {{"batch", plan.params.shape.batch}};
    for (const auto& [key, v] : want.items())
      if (m.meta.contains(key) && m.meta[key] != v)
        std::fprintf(stderr, "note: the trace's %s is %s, the simulation's %s\n", key.c_str(), m.meta[key].dump().c_str(),
                     v.dump().c_str());
    cmp = compare_timelines(sim, m);
  }
  if (args.flag("json")) {
    nlohmann::json j = plan_stats_json(stats);
    j["simulation"] = simulation_json(sim, params, cmp ? &*cmp : nullptr);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << format_plan_stats(stats) << format_simulation(sim, cmp ? &*cmp : nullptr);
  }
  return 0;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  Args args(argc, argv,
            {"model", "preset", "batch", "context", "policy", "sms", "block-size", "tiles-per-sm", "sim-params",
             "trace", "gpu"},
            {"json", "no-lm-head", "simulate", "help"});
  if (args.flag("help")) {
    std::printf(
        "usage: megadecode plan (--model DIR | --preset NAME) [--batch B] [--context L[,L2,...]] [--policy P]\n"
        "                       [--sms S] [--block-size N] [--tiles-per-sm N] [--no-lm-head] [--json]\n"
        "                       [--simulate [--gpu h100|h200] [--sim-params FILE.json] [--trace TRACE.json[.gz]]]\n"
        "  --context takes one length for every sequence, or one per sequence (cycled).\n"
        "  --simulate predicts the step's timing with the model of the megakernel on --gpu (default h200); --sim-params\n"
        "  overrides parameters (keys as in --json's \"params\"); --trace compares with a trace of\n"
        "  bench decode --trace (its per-layer timeline, error per op wave).\n");
    return 0;
  }
  MD_REQUIRE(args.has("model") != args.has("preset"), "give exactly one of --model DIR and --preset NAME");
  const ModelConfig config =
      args.has("model") ? load_model_config(args.require("model")) : preset_config(args.require("preset"));
  const int64_t batch = args.get_int("batch", 1);
  MD_REQUIRE(batch >= 1 && batch <= 4096, "--batch must be in 1..4096, got ", batch);
  const std::vector<int64_t> contexts = args.get_int_list("context", {1024});
  for (int64_t c : contexts) MD_REQUIRE(c >= 1 && c <= (1 << 24), "--context must be in 1..16777216, got ", c);

  Policy policy = policy_by_name(args.get("policy", "default"));
  if (args.has("tiles-per-sm")) {
    const int64_t tiles = args.get_int("tiles-per-sm", 1);
    MD_REQUIRE(tiles >= 1 && tiles <= 4096, "--tiles-per-sm must be in 1..4096, got ", tiles);
    policy.tiles_per_sm = static_cast<int>(tiles);
  }
  PlanOptions options;
  options.n_sms = static_cast<int>(args.get_int("sms", 132));
  options.lm_head = options.sample = !args.flag("no-lm-head");

  BatchState state;
  state.kv_block_size = static_cast<int>(args.get_int("block-size", 16));
  MD_REQUIRE(state.kv_block_size >= 1, "--block-size must be >= 1");
  // Distinct consecutive blocks per sequence: the plan does not depend on which blocks they are.
  std::vector<std::vector<int32_t>> tables(batch), rings(batch);
  const int window = config.block == BlockKind::kParallel ? config.max_sliding_window() : 0;
  const int ring_len = window > 0 ? kv_ring_length(window, state.kv_block_size) : 0;
  int32_t next_block = 0, next_ring = 0;
  for (int64_t i = 0; i < batch; ++i) {
    SeqState seq;
    seq.n_ctx = static_cast<int>(contexts[i % contexts.size()]);
    tables[i].resize((seq.n_ctx + state.kv_block_size - 1) / state.kv_block_size);
    std::iota(tables[i].begin(), tables[i].end(), next_block);
    next_block += static_cast<int32_t>(tables[i].size());
    seq.block_table = tables[i];
    // Sliding-window layers: a ring of min(R, blocks) blocks of the ring pool (kv/kv_cache.h).
    rings[i].resize(std::min<size_t>(ring_len, tables[i].size()));
    std::iota(rings[i].begin(), rings[i].end(), next_ring);
    next_ring += static_cast<int32_t>(rings[i].size());
    seq.ring_table = rings[i];
    state.seqs.push_back(seq);
  }
  const Plan plan = make_plan(config, state, policy, options);
  validate_plan(plan);
  const PlanStats stats = plan_stats(plan);
  if (args.flag("simulate")) return simulate_and_print(args, plan, stats);
  MD_REQUIRE(!args.has("sim-params") && !args.has("trace") && !args.has("gpu"),
             "--sim-params, --trace and --gpu need --simulate");
  if (args.flag("json")) {
    std::cout << plan_stats_json(stats).dump(2) << "\n";
  } else {
    std::cout << format_plan_stats(stats);
  }
  return 0;
}

}  // namespace megadecode
