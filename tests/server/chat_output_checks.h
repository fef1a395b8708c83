// Checks shared by the chat output parser tests (test_chat_output, test_cmd4_output): a parse's
// totals, and parsing one text whole, cut at every byte, and cut at random (seed given) to
// see that every way of cutting it into pieces gives exactly what the whole text gives.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "server/chat_output.h"

namespace megadecode::testing {

using OJson = nlohmann::ordered_json;

struct Parsed {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Parsed&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const Parsed& p) {
  os << "{reasoning \"" << p.reasoning << "\", content \"" << p.content << "\", calls [";
  for (const auto& [name, args] : p.calls) os << name << args << " ";
  return os << "]}";
}

inline void add(Parsed& p, ChatDelta d) {
  p.reasoning += d.reasoning;
  p.content += d.content;
  for (const ParsedToolCall& c : d.calls) {
    p.calls.emplace_back(c.name, c.arguments());
    ASSERT_FALSE(c.argument_fragments.empty());
  }
}

inline Parsed parse_pieces(const ChatOutputOptions& options, const std::vector<std::string>& pieces) {
  ChatOutputParser parser(options);
  Parsed p;
  for (const std::string& piece : pieces) add(p, parser.push(piece));
  add(p, parser.finish());
  return p;
}

// Parses `text` whole, then cut at every byte and at random cuts; all must agree.
inline Parsed parse_every_way(const ChatOutputOptions& options, const std::string& text, uint64_t seed) {
  const Parsed whole = parse_pieces(options, {text});
  for (size_t cut = 0; cut <= text.size(); ++cut)
    EXPECT_EQ(parse_pieces(options, {text.substr(0, cut), text.substr(cut)}), whole) << "cut at " << cut << " of: " << text;
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min(text.size() - at, static_cast<size_t>(rng.below(6)));
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    EXPECT_EQ(parse_pieces(options, pieces), whole) << "random pieces (seed " << seed << ") of: " << text;
  }
  return whole;
}

// A test with a fresh seed, printed.
class SeededTest : public ::testing::Test {
 protected:
  uint64_t seed = test_seed();
  void SetUp() override { std::printf("seed %llu\n", static_cast<unsigned long long>(seed)); }
};

inline ChatOutputOptions tools_options(ToolCallFormat format, OJson tools = OJson::array()) {
  ChatOutputOptions o;
  o.tool_format = format;
  o.tools = std::make_shared<const OJson>(std::move(tools));
  return o;
}

}  // namespace megadecode::testing
