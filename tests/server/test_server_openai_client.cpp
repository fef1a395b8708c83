// The official `openai` npm client against the server: tests/server/openai_client_test.mjs on the
// fake backend, and tests/server/openai_tools_test.mjs (tool calls, the client's streaming and
// runTools helpers, reasoning) on the scripted Qwen3 server. scripts/setup installs node and the
// client.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "scripted_server.h"

namespace megadecode {
namespace {

TEST(ServerOpenAiClient, NodeClientPasses) {
  const std::filesystem::path root = MEGADECODE_SOURCE_DIR;
  ASSERT_TRUE(std::filesystem::exists(root / "node_modules/openai/package.json"))
      << "the openai npm package is missing: run scripts/setup";
  testing::TestServer server;
  const std::string cmd = "cd '" + root.string() + "' && timeout 120 node tests/server/openai_client_test.mjs " +
                          "http://127.0.0.1:" + std::to_string(server.port()) + "/v1 fake-model 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  EXPECT_TRUE(server.drained());
}

TEST(ServerOpenAiClient, NodeClientToolHelpersPass) {
  const std::filesystem::path root = MEGADECODE_SOURCE_DIR;
  ASSERT_TRUE(std::filesystem::exists(root / "node_modules/openai/package.json"))
      << "the openai npm package is missing: run scripts/setup";
  testing::ScriptedServer server(ChatFamily::kQwen3);
  server.on_text("Weather in Paris?",
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  server.on_text("<tool_response>", "It is sunny in Paris.");
  server.on_text("Think first", "<think>\nLet me think.\n</think>\n\nDone thinking.");
  const std::string cmd = "cd '" + root.string() + "' && timeout 120 node tests/server/openai_tools_test.mjs " +
                          "http://127.0.0.1:" + std::to_string(server.port()) + "/v1 " + server.model() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  // The runTools loops sent the tool's result back as a tool message.
  bool tool_result_sent = false;
  for (const auto& r : server.records()) tool_result_sent |= r.request.find("\"role\":\"tool\"") != std::string::npos;
  EXPECT_TRUE(tool_result_sent);
}

}  // namespace
}  // namespace megadecode
