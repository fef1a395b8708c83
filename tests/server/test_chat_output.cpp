// sanitize: address
// The chat output parsers on their own: reasoning split, both tool-call formats, malformed calls,
// and, for every output, that any way of cutting the text into pieces (every single cut, and
// random multi-cuts with the seed printed) gives exactly what the whole text gives.
#include <gtest/gtest.h>

#include "chat_output_checks.h"

namespace megadecode {
namespace {

using testing::OJson;
using testing::parse_every_way;
using testing::Parsed;
using testing::tools_options;

class ChatOutput : public testing::SeededTest {};

TEST_F(ChatOutput, ReasoningSplit) {
  ChatOutputOptions o;
  o.reasoning = true;
  using P = Parsed;
  EXPECT_EQ(parse_every_way(o, "<think>\nLet me see.\n</think>\n\nIt is 4.", seed), (P{"\nLet me see.\n", "\n\nIt is 4.", {}}));
  EXPECT_EQ(parse_every_way(o, "<think>\n\n</think>\n\nHi", seed), (P{"\n\n", "\n\nHi", {}}));  // /no_think's block
  EXPECT_EQ(parse_every_way(o, "Plain answer, no block.", seed), (P{"", "Plain answer, no block.", {}}));
  EXPECT_EQ(parse_every_way(o, " <think>late</think>", seed), (P{"", " <think>late</think>", {}}));
  EXPECT_EQ(parse_every_way(o, "<think>cut off by max_tokens </thi", seed), (P{"cut off by max_tokens </thi", "", {}}));
  EXPECT_EQ(parse_every_way(o, "<thin", seed), (P{"", "<thin", {}}));
  EXPECT_EQ(parse_every_way(o, "<think>a</think>b</think>c", seed), (P{"a", "b</think>c", {}}));
  EXPECT_EQ(parse_every_way(o, "", seed), (P{"", "", {}}));
  o.include_reasoning = false;
  EXPECT_EQ(parse_every_way(o, "<think>secret</think>shown", seed), (P{"", "shown", {}}));
  // Thinking off: nothing is split.
  EXPECT_EQ(parse_every_way(ChatOutputOptions{}, "<think>x</think>y", seed), (P{"", "<think>x</think>y", {}}));
}

TEST_F(ChatOutput, HermesToolCalls) {
  const ChatOutputOptions o = tools_options(ToolCallFormat::kHermes);
  using P = Parsed;
  EXPECT_EQ(parse_every_way(o, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 3}}\n</tool_call>", seed),
            (P{"", "", {{"get_weather", "{\"city\": \"Zürich\", \"days\": 3}"}}}));
  EXPECT_EQ(parse_every_way(o, "Let me look.\n\n<tool_call>\n{\"name\":\"a\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": null}]}}\n</tool_call>", seed),
            (P{"", "Let me look.", {{"a", "{}"}, {"b", "{\"x\": [1, {\"y\": null}]}"}}}));
  // Arguments given as JSON text, or left out.
  EXPECT_EQ(parse_every_way(o, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": true}\"}</tool_call>", seed),
            (P{"", "", {{"f", "{\"k\": true}"}}}));
  EXPECT_EQ(parse_every_way(o, "<tool_call>{\"name\": \"f\"}</tool_call>", seed), (P{"", "", {{"f", "{}"}}}));
  // Cut off after a complete call body: still a call.
  EXPECT_EQ(parse_every_way(o, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", seed),
            (P{"", "", {{"f", "{\"a\": 1}"}}}));
  // No tools called: the text is the content, byte for byte.
  const std::string plain = "Nothing to call here.\n\n  <tool_ and <tool_call without end";
  EXPECT_EQ(parse_every_way(o, plain, seed), (P{"", plain, {}}));
}

TEST_F(ChatOutput, MalformedCallsAreContent) {
  const ChatOutputOptions o = tools_options(ToolCallFormat::kHermes);
  for (const std::string text :
       {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>",  // missing brace
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                           // no name
        "<tool_call>\n{\"name\": 7}\n</tool_call>",                                // name not a string
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",         // arguments not an object
        "<tool_call>\n[\"f\"]\n</tool_call>", "<tool_call>\n{\"name\": \"f\", \"argu",  // cut off mid-call
        "Before\n<tool_call>not json</tool_call>\nafter"}) {
    EXPECT_EQ(parse_every_way(o, text, seed), (Parsed{"", text, {}})) << text;
  }
  // A malformed call between good ones stays text in place.
  EXPECT_EQ(parse_every_way(o, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{bad}</tool_call><tool_call>{\"name\": \"c\"}</tool_call>", seed),
            (Parsed{"", "<tool_call>{bad}</tool_call>", {{"a", "{}"}, {"c", "{}"}}}));
}

TEST_F(ChatOutput, ParallelToolCallsFalseKeepsTheFirst) {
  ChatOutputOptions o = tools_options(ToolCallFormat::kHermes);
  o.parallel_tool_calls = false;
  EXPECT_EQ(parse_every_way(o, "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{\"name\": \"b\"}</tool_call>", seed),
            (Parsed{"", "", {{"a", "{}"}}}));
}

TEST_F(ChatOutput, Qwen3CoderToolCalls) {
  const OJson tools = OJson::parse(R"([{"type": "function", "function": {"name": "write_file", "parameters": {
      "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
      "count": {"type": "integer"}, "ratio": {"type": "number"}, "force": {"type": "boolean"},
      "tags": {"type": "array"}, "meta": {"type": "object"}, "limit": {"type": ["integer", "null"]}}}}}])");
  const ChatOutputOptions o = tools_options(ToolCallFormat::kQwen3Coder, tools);
  using P = Parsed;
  const std::string call =
      "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a b.txt\n</parameter>\n<parameter=content>\nline 1\n"
      "  line 2 with <tags> & \"quotes\"\n\n</parameter>\n<parameter=count>\n42\n</parameter>\n<parameter=ratio>\n0.5\n"
      "</parameter>\n<parameter=force>\ntrue\n</parameter>\n<parameter=tags>\n[\"x\", 1]\n</parameter>\n"
      "<parameter=meta>\n{\"k\": \"v\"}\n</parameter>\n<parameter=limit>\nnull\n</parameter>\n"
      "<parameter=extra>\n12\n</parameter>\n</function>\n</tool_call>";
  const std::string args =
      "{\"path\": \"/tmp/a b.txt\", \"content\": \"line 1\\n  line 2 with <tags> & \\\"quotes\\\"\\n\", \"count\": 42, "
      "\"ratio\": 0.5, \"force\": true, \"tags\": [\"x\", 1], \"meta\": {\"k\": \"v\"}, \"limit\": null, \"extra\": \"12\"}";
  EXPECT_EQ(parse_every_way(o, "I will write it.\n" + call, seed), (P{"", "I will write it.", {{"write_file", args}}}));
  // Values that do not read as their type stay text; an unknown function has no types.
  EXPECT_EQ(parse_every_way(o, "<tool_call>\n<function=write_file>\n<parameter=count>\nmany\n</parameter>\n</function>\n</tool_call>", seed),
            (P{"", "", {{"write_file", "{\"count\": \"many\"}"}}}));
  EXPECT_EQ(parse_every_way(o, "<tool_call>\n<function=other>\n<parameter=count>\n7\n</parameter>\n</function>\n</tool_call>", seed),
            (P{"", "", {{"other", "{\"count\": \"7\"}"}}}));
  // No parameters; the <tool_call> wrapper left out; </function> left out before </tool_call>.
  EXPECT_EQ(parse_every_way(o, "<tool_call>\n<function=list>\n</function>\n</tool_call>", seed), (P{"", "", {{"list", "{}"}}}));
  EXPECT_EQ(parse_every_way(o, "<function=list>\n<parameter=path>\n.\n</parameter>\n</function>", seed),
            (P{"", "", {{"list", "{\"path\": \".\"}"}}}));
  EXPECT_EQ(parse_every_way(o, "<tool_call>\n<function=list>\n<parameter=path>\n.\n</parameter>\n</tool_call>", seed),
            (P{"", "", {{"list", "{\"path\": \".\"}"}}}));
  // Malformed: no function, a parameter never closed, text between parameters.
  for (const std::string bad : {"<tool_call>\nhello\n</tool_call>",
                                "<tool_call>\n<function=f>\n<parameter=a>\nx\n</function>\n</tool_call>",
                                "<tool_call>\n<function=f>\nstray\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>",
                                "<tool_call>\n<function=>\n</function>\n</tool_call>"}) {
    EXPECT_EQ(parse_every_way(o, bad, seed), (P{"", bad, {}})) << bad;
  }
}

TEST_F(ChatOutput, ReasoningThenToolCall) {
  ChatOutputOptions o = tools_options(ToolCallFormat::kHermes);
  o.reasoning = true;
  // A call inside the reasoning is reasoning; after </think> it is a call.
  EXPECT_EQ(parse_every_way(o, "<think>\nMaybe <tool_call>{\"name\": \"x\"}</tool_call>?\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"a\"}}\n</tool_call>", seed),
            (Parsed{"\nMaybe <tool_call>{\"name\": \"x\"}</tool_call>?\n", "", {{"f", "{\"q\": \"a\"}"}}}));
}

TEST_F(ChatOutput, PrimedCallCompletesTheOpening) {
  ChatOutputOptions o = tools_options(ToolCallFormat::kHermes);
  o.primed = tool_call_opening(ToolCallFormat::kHermes, "get_time");
  EXPECT_EQ(parse_every_way(o, "{\"tz\": \"UTC\"}}\n</tool_call>", seed), (Parsed{"", "", {{"get_time", "{\"tz\": \"UTC\"}"}}}));
  // What the model made of it is not a call: the whole text, opening included, is the content.
  EXPECT_EQ(parse_every_way(o, "oops", seed), (Parsed{"", o.primed + "oops", {}}));
  o = tools_options(ToolCallFormat::kQwen3Coder);
  o.primed = tool_call_opening(ToolCallFormat::kQwen3Coder, "");
  EXPECT_EQ(parse_every_way(o, "ls>\n<parameter=dir>\n/\n</parameter>\n</function>\n</tool_call>", seed),
            (Parsed{"", "", {{"ls", "{\"dir\": \"/\"}"}}}));
}

TEST_F(ChatOutput, ArgumentFragmentsJoinToTheArguments) {
  const std::optional<std::vector<ParsedToolCall>> calls =
      parse_tool_calls(ToolCallFormat::kHermes, tool_call_tags(ToolCallFormat::kHermes)[0],
                       "{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": \"two\", \"c\": {}}}", OJson::array());
  ASSERT_TRUE(calls.has_value() && calls->size() == 1);
  EXPECT_EQ(calls->front().argument_fragments, (std::vector<std::string>{"{\"a\": 1", ", \"b\": \"two\"", ", \"c\": {}}"}));
  EXPECT_EQ(tool_call_format_from_name("qwen3_xml"), ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(tool_call_format_from_name("pythonic"), std::nullopt);
}

}  // namespace
}  // namespace megadecode
