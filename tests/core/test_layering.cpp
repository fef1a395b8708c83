// The include layering of src/, checked on the tree itself: every top-level folder has a layer,
// a file includes only its own folder or folders of lower layers (so no two folders include each
// other and nothing includes cli/, the composition root), and inside src/cuda the rooms follow
// the same rule (common < gemm < megakernel < prefill < batched < backend). A second test feeds the checker a
// small tree with violations, so it is known to catch them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;

// Lower layers first; folders of one layer never include each other.
const std::map<std::string, int> kLayers = {
    {"core", 0},  {"model", 1}, {"tokenizer", 1}, {"kv", 1},     {"sampling", 1}, {"plan", 2}, {"engine", 3},
    {"ref", 4},   {"structured", 4}, {"cuda", 5}, {"emu", 6}, {"server", 7}, {"bench", 7}, {"cli", 8}};
const std::map<std::string, int> kCudaRooms = {{"common", 0}, {"gemm", 1},    {"megakernel", 2},
                                               {"prefill", 3}, {"batched", 4}, {"backend", 5}};

// The top-level folder of a path relative to src ("cuda/common/ptx.cuh" -> "cuda") and, under
// cuda, the room ("common"); empty when the path has no folder.
std::pair<std::string, std::string> folder_of(const fs::path& rel) {
  auto it = rel.begin();
  if (rel.has_parent_path() && it != rel.end()) {
    const std::string top = it->string();
    ++it;
    std::string room;
    if (top == "cuda" && it != rel.end() && std::next(it) != rel.end()) room = it->string();
    return {top, room};
  }
  return {"", ""};
}

// Every violation of the layering in the tree at `src`, one line each ("" lines never).
std::vector<std::string> layering_violations(const fs::path& src, int* n_includes) {
  std::vector<std::string> out;
  const std::regex include_re(R"re(^\s*#\s*include\s+"([^"]+)")re");
  *n_includes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh") continue;
    const fs::path rel = fs::relative(entry.path(), src);
    const auto [from, from_room] = folder_of(rel);
    if (kLayers.count(from) == 0) {
      out.push_back(rel.string() + ": folder \"" + from + "\" has no layer");
      continue;
    }
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      ++*n_includes;
      const std::string where = rel.string() + ":" + std::to_string(n) + " includes \"" + m[1].str() + "\"";
      // Resolved like the compiler: next to the file first, then from src (the include root).
      fs::path target = entry.path().parent_path() / m[1].str();
      if (!fs::exists(target)) target = src / m[1].str();
      if (!fs::exists(target)) {
        out.push_back(where + ": no such file in src");
        continue;
      }
      const auto [to, to_room] = folder_of(fs::relative(fs::weakly_canonical(target), fs::weakly_canonical(src)));
      if (to == from) {
        if (from == "cuda" && from_room != to_room) {
          if (kCudaRooms.count(from_room) == 0 || kCudaRooms.count(to_room) == 0)
            out.push_back(where + ": a cuda room without a layer");
          else if (kCudaRooms.at(to_room) >= kCudaRooms.at(from_room))
            out.push_back(where + ": cuda/" + from_room + " may not include cuda/" + to_room);
        }
        continue;
      }
      if (kLayers.count(to) == 0) {
        out.push_back(where + ": folder \"" + to + "\" has no layer");
      } else if (kLayers.at(to) >= kLayers.at(from)) {
        out.push_back(where + ": " + from + " (layer " + std::to_string(kLayers.at(from)) + ") may not include " + to +
                      " (layer " + std::to_string(kLayers.at(to)) + ")");
      }
    }
  }
  return out;
}

TEST(Layering, SrcIncludesPointDownTheLayers) {
  int n = 0;
  const std::vector<std::string> bad = layering_violations(fs::path(MEGADECODE_SOURCE_DIR) / "src", &n);
  EXPECT_GT(n, 500) << "too few includes read: is MEGADECODE_SOURCE_DIR right?";
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(Layering, TheCheckerCatchesViolations) {
  const fs::path src = fs::temp_directory_path() / ("md_layering_" + std::to_string(test_seed())) / "src";
  write(src / "core/check.h", "#pragma once\n");
  write(src / "engine/engine.h", "#include \"core/check.h\"\n#include \"cli/main.h\"\n");  // upward into cli
  write(src / "cli/main.h", "#include \"engine/engine.h\"\n");
  write(src / "model/a.h", "#include \"tokenizer/b.h\"\n");  // same layer
  write(src / "tokenizer/b.h", "#include \"b_local.h\"\n");  // next to the file: fine
  write(src / "tokenizer/b_local.h", "\n");
  write(src / "cuda/common/x.cuh", "#include \"cuda/backend/y.h\"\n");  // room upward
  write(src / "cuda/backend/y.h", "#include \"cuda/common/x.cuh\"\n");
  write(src / "widgets/w.h", "\n");                        // folder without a layer
  write(src / "core/missing.h", "#include \"core/nope.h\"\n");
  int n = 0;
  const std::vector<std::string> bad = layering_violations(src, &n);
  fs::remove_all(src.parent_path());
  EXPECT_EQ(n, 8);
  auto has = [&](const std::string& what) {
    for (const std::string& b : bad)
      if (b.find(what) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("engine/engine.h:2 includes \"cli/main.h\""));
  EXPECT_TRUE(has("model (layer 1) may not include tokenizer (layer 1)"));
  EXPECT_TRUE(has("cuda/common may not include cuda/backend"));
  EXPECT_TRUE(has("folder \"widgets\" has no layer"));
  EXPECT_TRUE(has("no such file in src"));
  EXPECT_EQ(bad.size(), 5u) << ::testing::PrintToString(bad);
}

}  // namespace
}  // namespace megadecode
