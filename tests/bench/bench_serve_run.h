// Runs `megadecode bench serve` in-process against a test server at `port` with `args` (plus
// --url and --json): its exit code and the JSON it wrote (discarded when it wrote none).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"

namespace megadecode::testing {

inline std::pair<int, nlohmann::json> run_bench_serve(int port, std::vector<std::string> args) {
  const auto path = std::filesystem::temp_directory_path() / ("bench_serve_run_" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(path);
  args.insert(args.begin(), {"--url", "http://127.0.0.1:" + std::to_string(port), "--json", path.string()});
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  const int rc = bench_serve(static_cast<int>(argv.size()), argv.data());
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(path);
  return {rc, j};
}

}  // namespace megadecode::testing
