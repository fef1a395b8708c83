// scripts/results_index.py on a temporary results folder: it writes README.md from index.json (one
// table row a file), and --check passes on a folder that agrees with its manifest and fails, naming
// the cause, on each way they can disagree: an indexed file missing, a file not indexed (at the top or
// in a subfolder), an empty command, a README.md edited by hand or stale, a manifest that is not JSON.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kScript = fs::path(MEGADECODE_SOURCE_DIR) / "scripts/results_index.py";

std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, out};
  std::array<char, 4096> buf{};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ResultsIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    dir_ = fs::temp_directory_path() / ("md_results_index_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    write(dir_ / "decode-h100.json", "{}\n");
    write(dir_ / "suite-h200.txt", "ok\n");
    manifest_ = {{"about", "test"},
                 {"files",
                  {{{"file", "decode-h100.json"},
                    {"what", "decode | both models"},
                    {"gpu", "H100"},
                    {"date", "2026-12-06"},
                    {"commit", "60a2fae"},
                    {"command", "megadecode bench decode --batch 1,2 --json decode.json"}},
                   {{"file", "suite-h200.txt"},
                    {"what", "the GPU suite"},
                    {"gpu", "H200"},
                    {"date", "2026-12-05"},
                    {"commit", "7097e14"},
                    {"command", "scripts/gpu build tests"}}}}};
    write_manifest();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void write_manifest() { write(dir_ / "index.json", manifest_.dump(2) + "\n"); }
  std::pair<int, std::string> generate() const {
    return run("python3 '" + kScript.string() + "' --dir '" + dir_.string() + "'");
  }
  std::pair<int, std::string> check() const {
    return run("python3 '" + kScript.string() + "' --check --dir '" + dir_.string() + "'");
  }
  // --check fails and its output names `what`.
  void expect_check_fails(const std::string& what) const {
    const auto [rc, out] = check();
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(what), std::string::npos) << "expected \"" << what << "\" in:\n" << out;
  }

  fs::path dir_;
  json manifest_;
};

TEST_F(ResultsIndex, GeneratesTheTableAndChecksAFolderThatAgrees) {
  auto [rc, out] = check();
  EXPECT_NE(rc, 0) << out;  // no README.md yet
  EXPECT_NE(out.find("README.md"), std::string::npos) << out;

  std::tie(rc, out) = generate();
  ASSERT_EQ(rc, 0) << out;
  const std::string readme = read(dir_ / "README.md");
  EXPECT_NE(readme.find("| file | what | GPU | date | commit | command |"), std::string::npos) << readme;
  EXPECT_NE(readme.find("| `decode-h100.json` | decode \\| both models | H100 | 2026-12-06 | 60a2fae | "
                        "`megadecode bench decode --batch 1,2 --json decode.json` |"),
            std::string::npos)
      << readme;
  EXPECT_NE(
      readme.find("| `suite-h200.txt` | the GPU suite | H200 | 2026-12-05 | 7097e14 | `scripts/gpu build tests` |"),
      std::string::npos)
      << readme;

  std::tie(rc, out) = check();
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = generate();  // regenerating changes nothing
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(read(dir_ / "README.md"), readme);
}

TEST_F(ResultsIndex, CheckFailsOnEachDisagreement) {
  ASSERT_EQ(generate().first, 0);
  ASSERT_EQ(check().first, 0);

  // A file nobody indexed, at the top and in a subfolder.
  write(dir_ / "stray.log", "x\n");
  expect_check_fails("stray.log: in ");
  fs::remove(dir_ / "stray.log");
  write(dir_ / "serve-raw" / "a.json", "{}\n");
  expect_check_fails("serve-raw/a.json: in ");
  fs::remove_all(dir_ / "serve-raw");
  ASSERT_EQ(check().first, 0);

  // An indexed file that is gone.
  fs::rename(dir_ / "suite-h200.txt", dir_ / "suite.bak");
  expect_check_fails("suite-h200.txt: indexed in index.json but missing");
  fs::rename(dir_ / "suite.bak", dir_ / "suite-h200.txt");
  ASSERT_EQ(check().first, 0);

  // README.md edited by hand.
  write(dir_ / "README.md", read(dir_ / "README.md") + "| extra | row |\n");
  expect_check_fails("README.md differs");
  ASSERT_EQ(generate().first, 0);
  ASSERT_EQ(check().first, 0);

  // The manifest changed, README.md not regenerated.
  manifest_["files"][1]["what"] = "the GPU suite, call 2";
  write_manifest();
  expect_check_fails("README.md differs");
  ASSERT_EQ(generate().first, 0);
  ASSERT_EQ(check().first, 0);

  // An empty command fails even with README.md regenerated from it.
  manifest_["files"][0]["command"] = " ";
  write_manifest();
  ASSERT_EQ(generate().first, 0);
  expect_check_fails("'decode-h100.json'): command is empty");
  manifest_["files"][0].erase("command");
  write_manifest();
  ASSERT_EQ(generate().first, 0);
  expect_check_fails("command is empty");

  // A manifest that is not JSON.
  write(dir_ / "index.json", "{\"files\": [\n");
  expect_check_fails("not readable JSON");
}

}  // namespace
}  // namespace megadecode
