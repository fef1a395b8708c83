// `megadecode plan`: statistics of the full qwen3-30b-a3b shape at batch 1 and 64 (JSON and text:
// tiles sized to the SMs, attention items, the experts' worst case), --tiles-per-sm, a model
// directory read for its config.json only, and clear errors for bad flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli/commands.h"
#include "core/check.h"
#include "model/config.h"
#include "model/presets.h"
#include "../plan/plan_test_util.h"

namespace megadecode {
namespace {

using test::run_plan;

TEST(PlanCommand, FullShapeAtBatch1And64) {
  for (int batch : {1, 64}) {
    SCOPED_TRACE(cat("batch ", batch));
    const nlohmann::json j = nlohmann::json::parse(
        run_plan({"--preset", "qwen3-30b-a3b", "--batch", std::to_string(batch), "--context", "4096", "--json"}));
    EXPECT_EQ(j["batch"], batch);
    EXPECT_EQ(j["n_layers"], 48);
    EXPECT_EQ(j["n_sms"], 132);
    // Tiles sized to the 132 SMs: 33 per KV group, one per O-proj row block, 8 router tiles.
    EXPECT_EQ(j["ops"]["qkv"]["tasks"], 48 * 132);
    EXPECT_EQ(j["ops"]["o_proj"]["tasks"], 48 * 128);
    EXPECT_EQ(j["ops"]["router"]["tasks"], 48 * 8);
    EXPECT_EQ(j["ops"]["expert_up"]["tasks"], 48 * 132);  // one share per SM per layer
    EXPECT_EQ(j["ops"]["expert_down"]["tasks"], 48 * 132);
    EXPECT_EQ(j["ops"]["lm_head"]["tasks"], 132);
    EXPECT_EQ(j["ops"]["sample"]["tasks"], batch);
    // 4096 tokens in 16 splits of 256, 4 KV groups: one task per item and layer.
    EXPECT_EQ(j["attention"]["items"], batch * 16 * 4);
    EXPECT_EQ(j["attention"]["max_splits"], 16);
    EXPECT_EQ(j["ops"]["attn"]["tasks"], 48 * batch * 16 * 4);
    EXPECT_EQ(j["ops"]["attn"]["total_bytes"], int64_t{48} * batch * 4 * 4096 * 128 * 2 * 2);  // K and V, bf16
    // The experts at the worst case: 8 at batch 1, all 128 at batch 64.
    const int64_t active = batch == 1 ? 8 : 128;
    EXPECT_EQ(j["ops"]["expert_up"]["total_bytes"], 48 * active * 2 * 768 * 2048 * 2);
    EXPECT_EQ(j["ops"]["expert_down"]["total_bytes"], 48 * active * 2048 * 768 * 2);
    EXPECT_EQ(j["n_waves"], 48 * 6 + 2);
    EXPECT_EQ(j["critical_path_tasks"], 48 * 6 + 2);
    EXPECT_GE(j["critical_path_tasks_ordered"].get<int>(), j["critical_path_tasks"].get<int>());
    EXPECT_GT(j["counters"]["n"].get<int>(), 0);
    // The static weights are spread evenly over the SMs.
    EXPECT_LE(j["static_weight_bytes_per_sm"]["max"].get<double>(),
              1.02 * j["static_weight_bytes_per_sm"]["mean"].get<double>());
  }
  const std::string text = run_plan({"--preset", "qwen3-30b-a3b", "--batch", "64", "--policy", "grid-sync"});
  for (const char* want : {"policy grid-sync", "tasks per SM", "counters:", "attention: 1024 items per layer (at most 4 splits",
                           "critical path:", "expert_up"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " missing from:\n" << text;
  EXPECT_EQ(text.find("queues"), std::string::npos) << text;
  // --tiles-per-sm: two QKV and LM-head tiles per SM; O-proj has only its 128 row blocks.
  const nlohmann::json two = nlohmann::json::parse(
      run_plan({"--preset", "qwen3-30b-a3b", "--tiles-per-sm", "2", "--sms", "100", "--no-lm-head", "--json"}));
  EXPECT_EQ(two["n_sms"], 100);
  EXPECT_EQ(two["ops"]["qkv"]["tasks"], 48 * 200);
  EXPECT_EQ(two["ops"]["o_proj"]["tasks"], 48 * 128);
  EXPECT_FALSE(two["ops"].contains("lm_head"));
  EXPECT_FALSE(two["ops"].contains("sample"));
}

TEST(PlanCommand, ReadsOnlyConfigJsonFromAModelDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("md_plan_cmd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << model_config_to_json(preset_config("small")).dump();
  const nlohmann::json j = nlohmann::json::parse(
      run_plan({"--model", dir.string(), "--batch", "3", "--context", "1,97,4096", "--sms", "13", "--json"}));
  EXPECT_EQ(j["n_layers"], 2);
  EXPECT_EQ(j["n_sms"], 13);
  std::filesystem::remove_all(dir);
}

TEST(PlanCommand, BadFlagsAreErrors) {
  EXPECT_THROW(run_plan({"--batch", "2"}), Error);  // no model
  EXPECT_THROW(run_plan({"--preset", "tiny", "--batch", "0"}), Error);
  EXPECT_THROW(run_plan({"--preset", "tiny", "--policy", "fastest"}), Error);
  EXPECT_THROW(run_plan({"--preset", "tiny", "--sms", "0"}), Error);
  EXPECT_THROW(run_plan({"--preset", "tiny", "--context", "0"}), Error);
  EXPECT_THROW(run_plan({"--preset", "tiny", "--tiles-per-sm", "0"}), Error);
  try {  // past int: an Error naming the flag, not a wrapped-around tile count
    run_plan({"--preset", "tiny", "--tiles-per-sm", "4294967297"});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tiles-per-sm must be in 1..4096"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run_plan({"--preset", "tiny", "--tile-kib", "64"}), Error);  // the v1 tiling flag is gone
}

}  // namespace
}  // namespace megadecode
