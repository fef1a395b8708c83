// Help is consistent: `megadecode --help`, `-h` and every command's --help print their usage to
// stdout and exit 0 with nothing on stderr; mistakes print to stderr and exit non-zero.
#include <gtest/gtest.h>

#include "process.h"

namespace megadecode {
namespace {

using testing::Process;

std::string command_line(const std::vector<std::string>& args) {
  std::string line = "megadecode";
  for (const std::string& a : args) line += " " + a;
  return line;
}

TEST(CliHelp, EveryHelpGoesToStdout) {
  ASSERT_TRUE(std::filesystem::exists(testing::megadecode_binary())) << "build the megadecode target";
  const std::vector<std::vector<std::string>> helps = {
      {"--help"},           {"-h"},
      {"serve", "--help"},  {"generate", "--help"},
      {"make-model", "--help"}, {"tokenize", "--help"},
      {"plan", "--help"},   {"bench", "--help"},
      {"bench", "-h"},      {"bench", "decode", "--help"},
      {"bench", "prefill", "--help"}, {"bench", "serve", "--help"},
      {"bench", "tokenizer", "--help"}};
  for (const auto& args : helps) {
    SCOPED_TRACE(command_line(args));
    Process p(args);
    ASSERT_TRUE(p.spawned());
    EXPECT_EQ(p.wait_exit(std::chrono::seconds(30)), 0);
    EXPECT_NE(p.out().find("usage: megadecode"), std::string::npos) << "stdout: " << p.out();
    EXPECT_EQ(p.err(), "");
  }
}

TEST(CliHelp, MistakesGoToStderrWithAnErrorCode) {
  const std::vector<std::vector<std::string>> mistakes = {
      {}, {"frobnicate"}, {"serve", "--no-such-flag"}, {"bench"}, {"bench", "nothing"}, {"tokenize", "--bogus"}};
  for (const auto& args : mistakes) {
    SCOPED_TRACE(command_line(args));
    Process p(args);
    ASSERT_TRUE(p.spawned());
    const std::optional<int> rc = p.wait_exit(std::chrono::seconds(30));
    ASSERT_TRUE(rc.has_value());
    EXPECT_NE(*rc, 0);
    EXPECT_EQ(p.out(), "");
    EXPECT_NE(p.err(), "");
  }
}

}  // namespace
}  // namespace megadecode
