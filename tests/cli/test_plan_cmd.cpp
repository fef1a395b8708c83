// `megadecode plan`: statistics of the full qwen3-30b-a3b shape at batch 1 and 64 (JSON and text),
// a model directory read for its config.json only, and clear errors for bad flags.
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
    const nlohmann::json j = nlohmann::json::parse(
        run_plan({"--preset", "qwen3-30b-a3b", "--batch", std::to_string(batch), "--context", "4096", "--json"}));
    EXPECT_EQ(j["batch"], batch);
    EXPECT_EQ(j["n_layers"], 48);
    EXPECT_EQ(j["n_sms"], 132);
    EXPECT_EQ(j["ops"]["qkv"]["tasks"], 48 * 160);
    EXPECT_EQ(j["ops"]["o_proj"]["tasks"], 48 * 128);
    EXPECT_EQ(j["ops"]["attn"]["tasks"], 48 * 132);  // one drain task per SM per layer
    EXPECT_EQ(j["ops"]["lm_head"]["tasks"], 1187);
    EXPECT_EQ(j["n_waves"], 48 * 9 + 3);
    EXPECT_EQ(j["critical_path_tasks"], 48 * 9 + 3);
    EXPECT_GE(j["critical_path_tasks_ordered"].get<int>(), j["critical_path_tasks"].get<int>());
    EXPECT_LE(j["queues"]["attn_items"].get<int>(), j["queues"]["attn_capacity"].get<int>());
    EXPECT_GT(j["counters"]["n"].get<int>(), 0);
    EXPECT_LE(j["tasks_per_sm"]["max"].get<int>() - j["tasks_per_sm"]["min"].get<int>(), 2);
  }
  const std::string text = run_plan({"--preset", "qwen3-30b-a3b", "--batch", "64", "--policy", "grid-sync"});
  for (const char* want : {"policy grid-sync", "tasks per SM", "counters:", "queues:", "critical path:", "expert_up"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " missing from:\n" << text;
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
}

}  // namespace
}  // namespace megadecode
