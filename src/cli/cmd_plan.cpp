// `megadecode plan`: builds and validates the decode plan for a model shape and batch without
// loading weights (--preset uses the built-in shapes, --model reads only config.json), then prints
// its statistics: tasks per op and per SM, counters, queues, the critical path.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/commands.h"
#include "core/args.h"
#include "core/check.h"
#include "model/config.h"
#include "model/presets.h"
#include "plan/planner.h"
#include "plan/stats.h"
#include "plan/validator.h"

namespace megadecode {

int cmd_plan(int argc, char** argv) {
  Args args(argc, argv,
            {"model", "preset", "batch", "context", "policy", "sms", "block-size", "tile-kib", "lm-tile-kib"},
            {"json", "no-lm-head", "help"});
  if (args.flag("help")) {
    std::printf(
        "usage: megadecode plan (--model DIR | --preset NAME) [--batch B] [--context L[,L2,...]] [--policy P]\n"
        "                       [--sms S] [--block-size N] [--tile-kib K] [--lm-tile-kib K] [--no-lm-head] [--json]\n"
        "  --context takes one length for every sequence, or one per sequence (cycled).\n");
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
  if (args.has("tile-kib")) policy.tile_weight_bytes = args.get_int("tile-kib", 128) * 1024;
  if (args.has("lm-tile-kib")) policy.lm_tile_weight_bytes = args.get_int("lm-tile-kib", 512) * 1024;
  PlanOptions options;
  options.n_sms = static_cast<int>(args.get_int("sms", 132));
  options.lm_head = options.sample = !args.flag("no-lm-head");

  BatchState state;
  state.kv_block_size = static_cast<int>(args.get_int("block-size", 16));
  MD_REQUIRE(state.kv_block_size >= 1, "--block-size must be >= 1");
  // Distinct consecutive blocks per sequence: the plan does not depend on which blocks they are.
  std::vector<std::vector<int32_t>> tables(batch);
  int32_t next_block = 0;
  for (int64_t i = 0; i < batch; ++i) {
    SeqState seq;
    seq.n_ctx = static_cast<int>(contexts[i % contexts.size()]);
    tables[i].resize((seq.n_ctx + state.kv_block_size - 1) / state.kv_block_size);
    std::iota(tables[i].begin(), tables[i].end(), next_block);
    next_block += static_cast<int32_t>(tables[i].size());
    seq.block_table = tables[i];
    state.seqs.push_back(seq);
  }
  const Plan plan = make_plan(config, state, policy, options);
  validate_plan(plan);
  const PlanStats stats = plan_stats(plan);
  if (args.flag("json")) {
    std::cout << plan_stats_json(stats).dump(2) << "\n";
  } else {
    std::cout << format_plan_stats(stats);
  }
  return 0;
}

}  // namespace megadecode
