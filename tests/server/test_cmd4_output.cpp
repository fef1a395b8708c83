// sanitize: address
// North's cmd4 output parsers (cohere_command4) on their own: the reasoning / answer / action
// channels, markers stripped, citations removed, action blocks turned into calls (several,
// parallel or not, forced), malformed actions as plain content; every output parsed whole, cut at
// every byte and cut at random (seed printed), which must all agree.
#include <gtest/gtest.h>

#include "chat_output_checks.h"

namespace megadecode {
namespace {

using testing::OJson;
using testing::parse_every_way;
using testing::Parsed;
using P = Parsed;

OJson weather_tools() {
  return OJson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
}

// As prepare_chat sets them for a cmd4 template: both parsers, reasoning on unless `reasoning`.
ChatOutputOptions cmd4_options(bool reasoning = true, bool tools = true) {
  ChatOutputOptions o;
  o.reasoning_format = ReasoningFormat::kCohereCommand4;
  o.reasoning = reasoning;
  if (tools) {
    o.tool_format = ToolCallFormat::kCohereCommand4;
    o.tools = std::make_shared<const OJson>(weather_tools());
  }
  return o;
}

std::string action(const std::string& calls) { return "<|START_ACTION|>[\n    " + calls + "\n]<|END_ACTION|>"; }
std::string call(const std::string& id, const std::string& name, const std::string& parameters) {
  return "{\"tool_call_id\": \"" + id + "\", \"tool_name\": \"" + name + "\", \"parameters\": " + parameters + "}";
}

class Cmd4Output : public testing::SeededTest {};

TEST_F(Cmd4Output, ReasoningThenAnswer) {
  const ChatOutputOptions o = cmd4_options();
  EXPECT_EQ(parse_every_way(o, "Add them.<|END_THINKING|><|START_TEXT|>2 + 2 = 4.<|END_TEXT|>", seed),
            (P{"Add them.", "2 + 2 = 4.", {}}));
  // <|START_TEXT|> alone ends the reasoning too; <|START_RESPONSE|> is an answer as well.
  EXPECT_EQ(parse_every_way(o, "Hmm.<|START_TEXT|>Yes.<|END_TEXT|>", seed), (P{"Hmm.", "Yes.", {}}));
  EXPECT_EQ(parse_every_way(o, "r<|END_THINKING|><|START_RESPONSE|>a<|END_RESPONSE|>", seed), (P{"r", "a", {}}));
  // The answer without its markers, and text after the answer's end (until a marker) is dropped.
  EXPECT_EQ(parse_every_way(o, "r<|END_THINKING|>bare answer", seed), (P{"r", "bare answer", {}}));
  EXPECT_EQ(parse_every_way(o, "r<|END_THINKING|><|START_TEXT|>a<|END_TEXT|>junk", seed), (P{"r", "a", {}}));
  // Reasoning cut off by max_tokens stays reasoning; an empty one is empty.
  EXPECT_EQ(parse_every_way(o, "still thinking <|END_THI", seed), (P{"still thinking <|END_THI", "", {}}));
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|><|START_TEXT|>Hi<|END_TEXT|>", seed), (P{"", "Hi", {}}));
  // A model that opens its thinking again.
  EXPECT_EQ(parse_every_way(o, "<|START_THINKING|>a<|END_THINKING|><|START_TEXT|>b<|END_TEXT|>", seed), (P{"a", "b", {}}));
  // Text that only looks like the start of a marker is text.
  EXPECT_EQ(parse_every_way(o, "x <| y<|END_THINKING|><|START_TEXT|>1 < 2 <|<|END_TEXT|>", seed), (P{"x <| y", "1 < 2 <|", {}}));
}

TEST_F(Cmd4Output, ReasoningOffStartsInTheAnswer) {
  EXPECT_EQ(parse_every_way(cmd4_options(false), "<|START_TEXT|>Hello.<|END_TEXT|>", seed), (P{"", "Hello.", {}}));
  ChatOutputOptions hidden = cmd4_options();
  hidden.include_reasoning = false;
  EXPECT_EQ(parse_every_way(hidden, "secret<|END_THINKING|><|START_TEXT|>shown<|END_TEXT|>", seed), (P{"", "shown", {}}));
}

TEST_F(Cmd4Output, Citations) {
  const ChatOutputOptions o = cmd4_options();
  EXPECT_EQ(parse_every_way(o, "I saw <co>rain</co: 0:[0]>.<|END_THINKING|><|START_TEXT|>It is <co>sunny</co: 0:[1,2]> "
                               "and <co>warm</co: 0:[0],1:[0]>.<|END_TEXT|>", seed),
            (P{"I saw rain.", "It is sunny and warm.", {}}));
  // Not a citation's end: "</co: " followed by anything but sources and '>' is text, as is a
  // lone "<c"; an unclosed <co> is still dropped; a cut-off end tag is text.
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>a </co: b> <c <co>d", seed), (P{"", "a </co: b> <c d", {}}));
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>x<co>y</co: 0:[1", seed), (P{"", "xy</co: 0:[1", {}}));
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|><co>no sources</co: >!", seed), (P{"", "no sources!", {}}));
}

TEST_F(Cmd4Output, ActionsBecomeCalls) {
  const ChatOutputOptions o = cmd4_options();
  EXPECT_EQ(parse_every_way(o, "Check it.<|END_THINKING|>" + action(call("0", "get_weather", R"({"city": "Paris", "days": 2})")), seed),
            (P{"Check it.", "", {{"get_weather", R"({"city": "Paris", "days": 2})"}}}));
  // Several calls in one block, and two blocks; text after a block's end is dropped.
  const std::string two = action(call("0", "get_weather", R"({"city": "A"})") + ",\n    " +
                                 call("1", "get_weather", R"({"city": "B"})"));
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>" + two + "trailing", seed),
            (P{"", "", {{"get_weather", R"({"city": "A"})"}, {"get_weather", R"({"city": "B"})"}}}));
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>" + action(call("0", "f", "{}")) + action(call("1", "g", "null")), seed),
            (P{"", "", {{"f", "{}"}, {"g", "{}"}}}));
  ChatOutputOptions single = o;
  single.parallel_tool_calls = false;
  EXPECT_EQ(parse_every_way(single, "<|END_THINKING|>" + two, seed), (P{"", "", {{"get_weather", R"({"city": "A"})"}}}));
  // An action straight out of the reasoning; parameters as a JSON string; markers and citation
  // tags inside the JSON are the arguments' text, untouched.
  EXPECT_EQ(parse_every_way(o, "r" + action(call("0", "f", R"("{\"a\": 1}")")), seed), (P{"r", "", {{"f", R"({"a": 1})"}}}));
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>" + action(call("0", "write", R"({"text": "<co>x</co: 0:[0]> <|START_TEXT|>"})")), seed),
            (P{"", "", {{"write", R"({"text": "<co>x</co: 0:[0]> <|START_TEXT|>"})"}}}));
}

TEST_F(Cmd4Output, MalformedActionsArePlainContent) {
  const ChatOutputOptions o = cmd4_options();
  for (const std::string body : {"[{\"tool_name\": }]", "{\"tool_name\": \"f\"}", "[]", "[{\"parameters\": {}}]",
                                 "[{\"tool_name\": \"\"}]", "[{\"tool_name\": \"f\", \"parameters\": 3}]",
                                 "[{\"tool_name\": \"f\"}, 7]", "not json"}) {
    const std::string block = "<|START_ACTION|>" + body + "<|END_ACTION|>";
    EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>" + block, seed), (P{"", block, {}})) << body;
  }
  // Cut off inside the block: what came is not a complete list, so it is text.
  const std::string cut = "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_wea";
  EXPECT_EQ(parse_every_way(o, "<|END_THINKING|>" + cut, seed), (P{"", cut, {}}));
  // Without a tool-call parser (tool_choice "none"), a block is content as the model wrote it.
  const std::string block = action(call("0", "f", "{}"));
  EXPECT_EQ(parse_every_way(cmd4_options(true, false), "r<|END_THINKING|>" + block, seed), (P{"r", block, {}}));
}

TEST_F(Cmd4Output, ForcedCallsContinueTheOpening) {
  ChatOutputOptions o = cmd4_options(false);
  o.primed = tool_call_opening(ToolCallFormat::kCohereCommand4, "get_weather");
  EXPECT_EQ(o.primed, "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": ");
  EXPECT_EQ(parse_every_way(o, "{\"city\": \"Lima\"}}\n]<|END_ACTION|>", seed), (P{"", "", {{"get_weather", R"({"city": "Lima"})"}}}));
  o.primed = tool_call_opening(ToolCallFormat::kCohereCommand4, "");
  EXPECT_EQ(parse_every_way(o, "get_weather\", \"parameters\": {\"city\": \"Quito\"}}\n]<|END_ACTION|>", seed),
            (P{"", "", {{"get_weather", R"({"city": "Quito"})"}}}));
  EXPECT_EQ(parse_every_way(o, "oops", seed), (P{"", o.primed + "oops", {}}));
}

TEST_F(Cmd4Output, FormatNames) {
  EXPECT_EQ(tool_call_format_from_name("cohere_command4"), ToolCallFormat::kCohereCommand4);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::kCohereCommand4), "cohere_command4");
  EXPECT_EQ(reasoning_format_from_name("cohere_command4"), ReasoningFormat::kCohereCommand4);
  EXPECT_EQ(reasoning_format_from_name("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(reasoning_format_from_name("deepseek_r1"), std::nullopt);
  EXPECT_STREQ(reasoning_format_name(ReasoningFormat::kCohereCommand4), "cohere_command4");
  EXPECT_TRUE(cmd4_options(true, false).is_cmd4());
  EXPECT_FALSE(ChatOutputOptions{}.is_cmd4());
}

}  // namespace
}  // namespace megadecode
