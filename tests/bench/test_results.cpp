// Tests of the benchmarks' shared reporting (bench/results.h): the median of odd, even and empty
// sample sets in any order, and the JSON writer (round trip; an unwritable path names itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/results.h"
#include "core/check.h"
#include "core/rng.h"

namespace megadecode {
namespace {

TEST(BenchResults, MedianOfAnyOrder) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0}), 3.0);
  EXPECT_EQ(median({3.0, 1.0, 100.0, 2.0, 2.0}), 2.0);  // an outlier does not move it
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(40));
    std::vector<double> v(n);
    for (double& x : v) x = static_cast<double>(rng.below(1000));
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double want = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    for (int i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(i + 1)]);
    EXPECT_EQ(median(v), want) << "n " << n;
  }
}

TEST(BenchResults, JsonRoundTripAndUnwritablePath) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("md_results_" + std::to_string(test_seed()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  const nlohmann::json j = {{"bench", "x"}, {"values", {1.5, 2, 3}}};
  for (int indent : {-1, 0, 2}) {
    write_json(path, j, indent);
    std::ifstream in(path);
    EXPECT_EQ(nlohmann::json::parse(in), j) << "indent " << indent;
  }
  const std::string bad = (dir / "no" / "such" / "dir.json").string();
  try {
    write_json(bad, j);
    FAIL() << "no error for " << bad;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megadecode
