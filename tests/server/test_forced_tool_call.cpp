// Forced tool calls held to their tools' schemas (server/forced_tool_call.h): the tools a choice
// may call, and the call object's grammar. Random walks through the compiled grammar (seed
// printed) must give call objects naming one of the tools with arguments valid against that tool's
// own parameters, local $refs included.
#include <algorithm>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "../structured/structured_test_util.h"
#include "core/rng.h"
#include "server/forced_tool_call.h"

namespace megadecode {
namespace {

using structured::testing::Json;

const RequestJson kTools = RequestJson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}},
  {"type": "function", "function": {"name": "route", "parameters": {"type": "object",
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["x"], "additionalProperties": false}},
    "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
    "required": ["from", "to"], "additionalProperties": false}}}])");

TEST(ForcedToolCall, ToolsOfTheChoice) {
  const std::vector<ForcedTool> all = forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, kTools);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].name, "ping");
  EXPECT_EQ(all[1].index, 1u);
  EXPECT_EQ(all[1].parameters, RequestJson({{"type", "object"}}));  // no parameters: any object
  const std::vector<ForcedTool> one = forced_tools(ToolChoice{ToolChoice::Kind::kFunction, "route"}, kTools);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].index, 2u);
  EXPECT_EQ(one[0].parameters, kTools[2]["function"]["parameters"]);
}

TEST(ForcedToolCall, TheCallSchemaRebasesLocalRefs) {
  const structured::Spec one = forced_call_spec(forced_tools(ToolChoice{ToolChoice::Kind::kFunction, "route"}, kTools));
  const Json s1 = Json::parse(one.schema);
  EXPECT_EQ(s1["properties"]["name"], Json({{"const", "route"}}));
  EXPECT_EQ(s1["properties"]["arguments"]["properties"]["from"]["$ref"], "#/properties/arguments/$defs/point");
  EXPECT_EQ(s1["required"], Json::array({"name", "arguments"}));
  EXPECT_EQ(one.options.trailing_whitespace, 1);
  const structured::Spec all = forced_call_spec(forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, kTools));
  const Json s3 = Json::parse(all.schema);
  ASSERT_EQ(s3["anyOf"].size(), 3u);
  EXPECT_EQ(s3["anyOf"][2]["properties"]["arguments"]["properties"]["to"]["$ref"],
            "#/anyOf/2/properties/arguments/$defs/point");
}

TEST(ForcedToolCall, EveryWalkIsACallOfOneToolWithValidArguments) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  structured::Compiler compiler(structured::testing::byte_vocab());
  for (const ToolChoice& choice : {ToolChoice{ToolChoice::Kind::kRequired, ""},
                                   ToolChoice{ToolChoice::Kind::kFunction, "get_weather"},
                                   ToolChoice{ToolChoice::Kind::kFunction, "route"}}) {
    const std::vector<ForcedTool> tools = forced_tools(choice, kTools);
    const structured::Spec spec = forced_call_spec(tools);
    int complete = 0;
    for (int i = 0; i < 60; ++i) {
      std::shared_ptr<TokenConstraint> c = compiler.make(spec);
      const structured::testing::Walk w = structured::testing::random_walk(*c, compiler.vocab(), rng, 400);
      ASSERT_EQ(w.error, "") << w.text;
      if (!w.complete) continue;
      ++complete;
      const Json call = Json::parse(w.text, nullptr, false);
      ASSERT_TRUE(call.is_object()) << w.text;
      ASSERT_TRUE(call.contains("name") && call.contains("arguments")) << w.text;
      const auto t = std::find_if(tools.begin(), tools.end(), [&](const ForcedTool& f) { return call["name"] == f.name; });
      ASSERT_NE(t, tools.end()) << w.text;
      const Json params = Json::parse(t->parameters.dump());
      EXPECT_EQ(structured::testing::validate(call["arguments"], params, params), "") << w.text;
      EXPECT_LE(w.text.size() - w.text.find_last_not_of('\n') - 1, 1u) << w.text;  // at most one "\n" at the end
    }
    EXPECT_GT(complete, 30) << choice.name;
  }
}

}  // namespace
}  // namespace megadecode
