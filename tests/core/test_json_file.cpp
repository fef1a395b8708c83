// Tests of the one JSON file writer (core/json_file.h): a round trip at every indent; an unwritable
// path names itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"
#include "core/json_file.h"
#include "core/rng.h"

namespace megadecode {
namespace {

TEST(JsonFile, RoundTripAndUnwritablePath) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("md_json_file_" + std::to_string(test_seed()));
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
