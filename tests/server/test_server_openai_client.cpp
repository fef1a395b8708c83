// The official `openai` npm client against the server (fake backend): runs
// tests/server/openai_client_test.mjs with node and expects it to pass. scripts/setup installs
// node and the client.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "server_fixture.h"

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

}  // namespace
}  // namespace megadecode
