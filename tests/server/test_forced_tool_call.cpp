// Forced tool calls held to their tools' schemas (server/forced_tool_call.h): the tools a choice
// may call, and the call's grammar in each format. Random walks through the compiled grammar (seed
// printed) must give calls that the server's own parser (server/tool_call_formats.h) reads back as
// naming one of the tools with arguments valid against that tool's own parameters, local $refs
// included: Hermes call objects, Qwen3-Coder's XML parameters, cmd4's action lists.
#include <algorithm>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "../structured/structured_test_util.h"
#include "core/rng.h"
#include "server/forced_tool_call.h"
#include "server/tool_call_formats.h"

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
  const structured::Spec one = forced_call_spec(ToolCallFormat::kHermes, forced_tools(ToolChoice{ToolChoice::Kind::kFunction, "route"}, kTools), false);
  const Json s1 = Json::parse(one.schema);
  EXPECT_EQ(s1["properties"]["name"], Json({{"const", "route"}}));
  EXPECT_EQ(s1["properties"]["arguments"]["properties"]["from"]["$ref"], "#/properties/arguments/$defs/point");
  EXPECT_EQ(s1["required"], Json::array({"name", "arguments"}));
  EXPECT_EQ(one.options.trailing_whitespace, 1);
  const structured::Spec all = forced_call_spec(ToolCallFormat::kHermes, forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, kTools), false);
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
    const structured::Spec spec = forced_call_spec(ToolCallFormat::kHermes, tools, false);
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

// Qwen3-Coder's tools: every parameter form the XML call writes (text, enum text, JSON by type,
// null, any), a $ref inside a JSON value, a tool without parameters.
const RequestJson kCoderTools = RequestJson::parse(R"([
  {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object",
    "$defs": {"mode": {"type": "integer", "minimum": 0, "maximum": 511}},
    "properties": {
      "path": {"type": "string", "description": "where"},
      "content": {"type": "string"},
      "mode": {"type": ["integer", "null"]},
      "ratio": {"type": "number"},
      "force": {"type": "boolean"},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
      "meta": {"type": "object", "properties": {"k": {"$ref": "#/$defs/mode"}}, "required": ["k"],
               "additionalProperties": false},
      "kind": {"enum": ["a", "b c", 7]},
      "level": {"type": "string", "enum": ["low", "high"]},
      "nothing": {"type": "null"},
      "anything": {}},
    "required": ["path", "content", "meta"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}},
  {"type": "function", "function": {"name": "count", "parameters": {"type": "object",
    "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["n"]}}}])");

// Bytes, XML pieces (one of them the call's own end, which no text may hold) and an end token.
structured::Vocabulary xml_vocab() {
  std::vector<std::string> bytes;
  std::vector<bool> text;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"\n</parameter>\n", "</function>\n", "<parameter=", "\n</param", "eter>", "</tool_call>",
                            "null", "true"})
    bytes.push_back(piece);
  text.assign(bytes.size(), true);
  bytes.push_back("<eos>");
  text.push_back(false);
  const int32_t end = static_cast<int32_t>(bytes.size()) - 1;
  return structured::Vocabulary(std::move(bytes), std::move(text), {end});
}

// Feeds `text` byte by byte (byte_vocab ids); the byte offset where the grammar refused, or -1 when
// it took everything and may end there.
int refused_at(structured::Compiler& compiler, const structured::Spec& spec, const std::string& text) {
  std::shared_ptr<TokenConstraint> c = compiler.make(spec);
  for (size_t i = 0; i < text.size(); ++i)
    if (!c->accept(static_cast<uint8_t>(text[i]))) return static_cast<int>(i);
  return c->accepting() ? -1 : static_cast<int>(text.size());
}

TEST(ForcedToolCall, Qwen3CoderWalksParseToValidCalls) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  structured::Compiler compiler(xml_vocab());
  const Json tools_json = Json::parse(kCoderTools.dump());
  const ToolCallTags tags = tool_call_tags(ToolCallFormat::kQwen3Coder)[0];
  for (const ToolChoice& choice : {ToolChoice{ToolChoice::Kind::kRequired, ""},
                                   ToolChoice{ToolChoice::Kind::kFunction, "write_file"},
                                   ToolChoice{ToolChoice::Kind::kFunction, "count"}}) {
    const std::vector<ForcedTool> tools = forced_tools(choice, kCoderTools);
    const structured::Spec spec = forced_call_spec(ToolCallFormat::kQwen3Coder, tools, true);
    int complete = 0, texts = 0;
    for (int i = 0; i < 80; ++i) {
      std::shared_ptr<TokenConstraint> c = compiler.make(spec);
      const structured::testing::Walk w =
          structured::testing::random_walk(*c, compiler.vocab(), rng, 600, {"\n</parameter>\n", "</function>\n"});
      ASSERT_EQ(w.error, "") << w.text;
      if (!w.complete) continue;
      ++complete;
      EXPECT_TRUE(w.text.starts_with("<function=") && w.text.ends_with("</function>\n")) << w.text;
      EXPECT_EQ(w.text.find("</tool_call>"), std::string::npos) << w.text;
      const auto calls = parse_tool_calls(ToolCallFormat::kQwen3Coder, tags, "\n" + w.text, tools_json);
      ASSERT_TRUE(calls.has_value() && calls->size() == 1) << w.text;
      const ParsedToolCall& call = (*calls)[0];
      const auto t = std::find_if(tools.begin(), tools.end(), [&](const ForcedTool& f) { return call.name == f.name; });
      ASSERT_NE(t, tools.end()) << w.text;
      const Json args = Json::parse(call.arguments(), nullptr, false);
      ASSERT_TRUE(args.is_object()) << call.arguments();
      const Json params = Json::parse(t->parameters.dump());
      EXPECT_EQ(structured::testing::validate(args, params, params), "") << w.text << "\n" << call.arguments();
      if (args.contains("content") && args["content"].get<std::string>().size() > 2) ++texts;
    }
    EXPECT_GT(complete, 40) << choice.name;
    if (choice.name == "write_file") {
      EXPECT_GT(texts, 10) << "the walks write raw text";
    }
  }
}

TEST(ForcedToolCall, Qwen3CoderCallIsExactlyTheTemplatesForm) {
  structured::Compiler compiler(structured::testing::byte_vocab());
  const structured::Spec spec =
      forced_call_spec(ToolCallFormat::kQwen3Coder, forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, kCoderTools), true);
  const std::string fn = "<function=write_file>\n", path = "<parameter=path>\n/tmp/a b.txt\n</parameter>\n";
  const std::string head = fn + path;
  const std::string content = "<parameter=content>\nline 1\n  a < b && </param> \"q\" é\n\n</parameter>\n";
  const std::string meta = "<parameter=meta>\n{\"k\": 420}\n</parameter>\n";
  const std::string call = head + content + "<parameter=mode>\nnull\n</parameter>\n" + meta +
                           "<parameter=kind>\nb c\n</parameter>\n<parameter=nothing>\nnull\n</parameter>\n</function>\n";
  EXPECT_EQ(refused_at(compiler, spec, call), -1);
  EXPECT_EQ(refused_at(compiler, spec, "<function=ping>\n</function>\n"), -1);
  EXPECT_EQ(refused_at(compiler, spec, "<function=count>\n<parameter=n>\n-5\n</parameter>\n</function>\n"), -1);
  // Refused: a required parameter left out, the schema's order broken, a number out of range, text
  // where the declared type reads JSON, a text value holding its own end or the call's, a value
  // outside the enum, an unknown parameter or tool, a missing line break.
  const std::string no_meta = head + content + "</function>\n";
  EXPECT_EQ(refused_at(compiler, spec, no_meta), static_cast<int>((head + content).size()) + 1);
  EXPECT_EQ(refused_at(compiler, spec, fn + content + path + meta + "</function>\n"), static_cast<int>(fn.size()) + 11);
  EXPECT_NE(refused_at(compiler, spec, "<function=count>\n<parameter=n>\n6\n</parameter>\n</function>\n"), -1);
  EXPECT_NE(refused_at(compiler, spec, head + content + "<parameter=mode>\nmany\n</parameter>\n" + meta + "</function>\n"), -1);
  const std::string own_end = "<function=write_file>\n<parameter=path>\na</parameter>";
  EXPECT_EQ(refused_at(compiler, spec, own_end), static_cast<int>(own_end.size()) - 1);
  const std::string call_end = "<function=write_file>\n<parameter=path>\na</tool_call>";
  EXPECT_EQ(refused_at(compiler, spec, call_end), static_cast<int>(call_end.size()) - 1);
  EXPECT_NE(refused_at(compiler, spec, head + content + meta + "<parameter=kind>\n7\n</parameter>\n</function>\n"), -1);
  EXPECT_NE(refused_at(compiler, spec, head + content + meta + "<parameter=extra>\n1\n</parameter>\n</function>\n"), -1);
  EXPECT_NE(refused_at(compiler, spec, "<function=other>\n</function>\n"), -1);
  EXPECT_NE(refused_at(compiler, spec, "<function=ping></function>\n"), -1);
  // A text value's bytes are valid UTF-8 without control bytes but tab, newline and CR.
  for (const std::string& bad : {std::string("\xC3\x28"), std::string("\x01"), std::string("\xED\xA0\x80")}) {
    const std::string text = "<function=write_file>\n<parameter=path>\n" + bad;
    EXPECT_NE(refused_at(compiler, spec, text), -1);
    EXPECT_LT(refused_at(compiler, spec, text), static_cast<int>(text.size()));
  }
}

TEST(ForcedToolCall, Qwen3CoderRefusesWhatItsTextCannotHold) {
  structured::Compiler compiler(structured::testing::byte_vocab());
  auto refusal = [&](const char* parameters) -> std::pair<std::string, std::string> {
    const RequestJson tools = RequestJson::array(
        {RequestJson{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", RequestJson::parse(parameters)}}}}});
    try {
      compiler.compile(forced_call_spec(ToolCallFormat::kQwen3Coder, forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, tools), true));
    } catch (const structured::SchemaError& e) {
      return {e.keyword(), e.pointer()};
    }
    return {"", "(compiled)"};
  };
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}})"),
            (P{"anyOf", "/properties/x/anyOf"}));
  EXPECT_EQ(refusal(R"({"type": "object", "$defs": {"p": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/p"}}})"),
            (P{"$ref", "/properties/x/$ref"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"type": "string", "maxLength": 3}}})"),
            (P{"maxLength", "/properties/x/maxLength"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"format": "uuid"}}})"), (P{"format", "/properties/x/format"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"properties": {"a": {}}}}})"),
            (P{"properties", "/properties/x/properties"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"enum": [1, 2]}}})"), (P{"enum", "/properties/x/enum"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"const": "a</parameter>"}}})"), (P{"const", "/properties/x/const"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"a>b": {"type": "string"}}})"), (P{"properties", "/properties/a>b"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {" a": {"type": "string"}}})"), (P{"properties", "/properties/ a"}));
  EXPECT_EQ(refusal(R"({"anyOf": [{"type": "object"}]})"), (P{"anyOf", "/anyOf"}));
  EXPECT_EQ(refusal(R"({"type": "array"})"), (P{"type", "/type"}));
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}})"),
            (P{"pattern", "/properties/x/pattern"}));  // the JSON path's own refusal, the tool's pointer
  // Kept: a typed union (read by its first type), a string enum beside type, any value.
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"x": {"type": ["integer", "string"]}, "y": {"type": "string",
                       "enum": ["a"]}, "z": true}})"),
            (P{"", "(compiled)"}));
}

TEST(ForcedToolCall, Cmd4WalksParseToValidActionLists) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  structured::Compiler compiler(structured::testing::byte_vocab());
  const Json tools_json = Json::parse(kTools.dump());
  const ToolCallTags tags = tool_call_tags(ToolCallFormat::kCohereCommand4)[0];
  for (const bool parallel : {false, true}) {
    const std::vector<ForcedTool> tools = forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, kTools);
    const structured::Spec spec = forced_call_spec(ToolCallFormat::kCohereCommand4, tools, parallel);
    int complete = 0;
    for (int i = 0; i < 60; ++i) {
      std::shared_ptr<TokenConstraint> c = compiler.make(spec);
      const structured::testing::Walk w = structured::testing::random_walk(*c, compiler.vocab(), rng, 500);
      ASSERT_EQ(w.error, "") << w.text;
      if (!w.complete) continue;
      ++complete;
      const auto calls = parse_tool_calls(ToolCallFormat::kCohereCommand4, tags, w.text, tools_json);
      ASSERT_TRUE(calls.has_value() && !calls->empty()) << w.text;
      if (!parallel) {
        EXPECT_EQ(calls->size(), 1u) << w.text;
      }
      for (const ParsedToolCall& call : *calls) {
        const auto t = std::find_if(tools.begin(), tools.end(), [&](const ForcedTool& f) { return call.name == f.name; });
        ASSERT_NE(t, tools.end()) << w.text;
        const Json params = Json::parse(t->parameters.dump());
        EXPECT_EQ(structured::testing::validate(Json::parse(call.arguments()), params, params), "") << w.text;
      }
    }
    EXPECT_GT(complete, 30) << parallel;
  }
  // The template's own layout is inside the grammar, several calls with parallel_tool_calls.
  const structured::Spec spec =
      forced_call_spec(ToolCallFormat::kCohereCommand4, forced_tools(ToolChoice{ToolChoice::Kind::kRequired, ""}, kTools), true);
  EXPECT_EQ(refused_at(compiler, spec,
                       "[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}},"
                       "\n    {\"tool_call_id\": \"1\", \"tool_name\": \"ping\", \"parameters\": {}}\n]"),
            -1);
  EXPECT_NE(refused_at(compiler, spec, "[]"), -1);
  EXPECT_NE(refused_at(compiler, spec, "[{\"tool_call_id\": \"0\", \"tool_name\": \"nope\", \"parameters\": {}}]"), -1);
}

}  // namespace
}  // namespace megadecode
