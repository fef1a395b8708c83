// The schema compiler's language, checked byte by byte on a vocabulary of the 256 single bytes:
// integer ranges exhaustively, formats, string lengths, property order, whitespace policy,
// recursion, JSON mode, choice; every refused keyword names itself and its JSON pointer.
// sanitize: address
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "structured/compiler.h"
#include "structured/matcher.h"
#include "structured/framed.h"
#include "structured/reasoning.h"
#include "structured_test_util.h"

namespace megadecode::structured {
namespace {

Compiler& compiler() {
  static Compiler c(testing::byte_vocab());
  return c;
}

// The text is a complete output of the spec.
bool matches(const Spec& spec, const std::string& text) {
  const std::shared_ptr<TokenConstraint> c = compiler().make(spec);
  for (const char ch : text)
    if (!c->accept(static_cast<uint8_t>(ch))) return false;
  return c->accepting();
}

bool schema_matches(const std::string& schema, const std::string& text, Options options = {}) {
  return matches(Spec::json_schema(schema, options), text);
}

TEST(StructuredSchema, IntegerRangesExact) {
  struct Range {
    std::optional<int64_t> lo, hi;
  };
  const std::vector<Range> ranges = {{0, 0},     {1, 9},       {-5, 5},   {7, 123},  {-130, -7}, {99, 1000},
                                     {-1, 1},    {10, 10},     {0, std::nullopt}, {42, std::nullopt},
                                     {-42, std::nullopt}, {std::nullopt, 17}, {std::nullopt, -3}, {-999, 99}};
  for (const Range& r : ranges) {
    nlohmann::json s = {{"type", "integer"}};
    if (r.lo) s["minimum"] = *r.lo;
    if (r.hi) s["maximum"] = *r.hi;
    const int64_t from = (r.lo ? *r.lo : (r.hi ? *r.hi : 0) - 1200) - 50;
    const int64_t to = (r.hi ? *r.hi : (r.lo ? *r.lo : 0) + 1200) + 50;
    for (int64_t n = from; n <= to; ++n) {
      const bool in = (!r.lo || n >= *r.lo) && (!r.hi || n <= *r.hi);
      ASSERT_EQ(schema_matches(s.dump(), std::to_string(n)), in) << n << " for " << s.dump();
    }
    EXPECT_FALSE(schema_matches(s.dump(), "01"));
    EXPECT_FALSE(schema_matches(s.dump(), "-0"));
  }
  EXPECT_TRUE(schema_matches(R"({"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":6})", "4"));
  EXPECT_FALSE(schema_matches(R"({"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":6})", "3"));
  EXPECT_FALSE(schema_matches(R"({"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":6})", "6"));
  EXPECT_TRUE(schema_matches(R"({"type":"integer"})", "-0"));
  EXPECT_TRUE(schema_matches(R"({"type":"integer"})", "123456789012345678901234567890"));
}

TEST(StructuredSchema, NumbersAndLiterals) {
  for (const char* ok : {"0", "-1.5", "3e10", "2.5E-3", "10"}) EXPECT_TRUE(schema_matches(R"({"type":"number"})", ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "-"}) EXPECT_FALSE(schema_matches(R"({"type":"number"})", bad)) << bad;
  EXPECT_TRUE(schema_matches(R"({"type":"boolean"})", "false"));
  EXPECT_TRUE(schema_matches(R"({"enum":["a",1,null,{"x":[true]}]})", R"({"x":[true]})"));
  EXPECT_FALSE(schema_matches(R"({"enum":["a",1,null]})", "2"));
  EXPECT_TRUE(schema_matches(R"({"const":"hi"})", R"("hi")"));
  EXPECT_TRUE(schema_matches(R"({"type":["integer","null"]})", "null"));
  EXPECT_TRUE(schema_matches(R"({"type":"string","enum":["a",1]})", R"("a")"));
  EXPECT_FALSE(schema_matches(R"({"type":"string","enum":["a",1]})", "1"));
}

// Every number the grammar takes is a finite double, so a JSON parser and a tool call's typed
// parameter read it as a number (81E325 once came out of a random walk and overflowed).
TEST(StructuredSchema, NumbersStayFinite) {
  const std::string nines308(308, '9'), nines208(208, '9');
  for (const char* schema : {R"({"type":"number"})", R"({})"}) {
    for (const std::string& ok : {std::string("1e99"), std::string("-9E-99"), nines208 + ".5e+99", nines208 + "e99"}) {
      EXPECT_TRUE(schema_matches(schema, ok)) << schema << " " << ok.substr(0, 20);
      const auto v = nlohmann::json::parse(ok, nullptr, false);
      EXPECT_TRUE(v.is_number()) << ok.substr(0, 20);
    }
    for (const std::string& bad : {std::string("81E325"), std::string("1e100"), std::string("1e-100"),
                                   "1" + nines208 + "e1"}) {
      EXPECT_FALSE(schema_matches(schema, bad)) << schema << " " << bad.substr(0, 20);
    }
  }
  EXPECT_TRUE(nlohmann::json::parse("-" + nines308, nullptr, false).is_number());
  for (const char* schema : {R"({"type":"integer"})", R"({"type":"integer","maximum":5})"}) {
    EXPECT_TRUE(schema_matches(schema, "-" + nines308)) << schema;
    EXPECT_FALSE(schema_matches(schema, "-1" + nines308)) << schema;
  }
  for (const char* schema : {R"({"type":"integer"})", R"({"type":"integer","minimum":-5})", R"({"type":"integer","minimum":3})"}) {
    EXPECT_TRUE(schema_matches(schema, nines308)) << schema;
    EXPECT_FALSE(schema_matches(schema, "1" + nines308)) << schema;
  }
  EXPECT_TRUE(nlohmann::json::parse("1" + nines308, nullptr, false).is_discarded());  // why the bound
}

TEST(StructuredSchema, StringsLengthsAndFormats) {
  const std::string two = R"({"type":"string","minLength":1,"maxLength":2})";
  EXPECT_TRUE(schema_matches(two, "\"\xC3\xA9\xE4\xB8\xAD\""));  // two characters, five bytes
  EXPECT_TRUE(schema_matches(two, R"("\n\u00e9")"));
  EXPECT_FALSE(schema_matches(two, R"("abc")"));
  EXPECT_FALSE(schema_matches(two, R"("")"));
  EXPECT_FALSE(schema_matches(R"({"type":"string"})", R"("\ud800")"));  // lone surrogate
  EXPECT_FALSE(schema_matches(R"({"type":"string"})", "\"\xC0\x80\""));  // overlong UTF-8
  EXPECT_FALSE(schema_matches(R"({"type":"string"})", "\"\xED\xA0\x80\""));  // surrogate in UTF-8
  EXPECT_FALSE(schema_matches(R"({"type":"string"})", "\"a\nb\""));  // raw control byte
  EXPECT_TRUE(schema_matches(R"({"type":"string","format":"date"})", R"("2024-02-29")"));
  EXPECT_FALSE(schema_matches(R"({"type":"string","format":"date"})", R"("2024-13-01")"));
  EXPECT_FALSE(schema_matches(R"({"type":"string","format":"date"})", R"("2024-00-10")"));
  EXPECT_TRUE(schema_matches(R"({"type":"string","format":"date-time"})", R"("2024-02-29T23:59:07.25+05:30")"));
  EXPECT_TRUE(schema_matches(R"({"type":"string","format":"date-time"})", R"("2024-02-29T00:00:00Z")"));
  EXPECT_FALSE(schema_matches(R"({"type":"string","format":"date-time"})", R"("2024-02-29T24:00:00Z")"));
  EXPECT_TRUE(schema_matches(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-A456-426614174000")"));
  EXPECT_FALSE(schema_matches(R"({"type":"string","format":"uuid"})", R"("123e4567e89b-12d3-a456-426614174000")"));
}

TEST(StructuredSchema, ObjectsInSchemaOrder) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
                            "c":{"type":"integer"}},"required":["a","c"]})";
  EXPECT_TRUE(schema_matches(s, R"({"a":1,"c":2})"));
  EXPECT_TRUE(schema_matches(s, R"({"a":1,"b":2,"c":3})"));
  EXPECT_FALSE(schema_matches(s, R"({"c":2,"a":1})"));
  EXPECT_FALSE(schema_matches(s, R"({"a":1})"));
  EXPECT_FALSE(schema_matches(s, R"({"a":1,"c":2,"d":3})"));  // additionalProperties absent: none
  const std::string opt = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}})";
  EXPECT_TRUE(schema_matches(opt, "{}"));
  EXPECT_TRUE(schema_matches(opt, R"({"b":2})"));
  EXPECT_FALSE(schema_matches(opt, R"({,"b":2})"));
  const std::string extra = R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})";
  EXPECT_TRUE(schema_matches(extra, R"({"a":1,"x":"y","z":""})"));
  EXPECT_TRUE(schema_matches(extra, R"({"x":"y"})"));
  EXPECT_FALSE(schema_matches(extra, R"({"x":1})"));
  EXPECT_TRUE(schema_matches(R"({"type":"object","additionalProperties":true})", R"({"x":[1,{"y":null}]})"));
}

TEST(StructuredSchema, WhitespacePolicy) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}})";
  EXPECT_TRUE(schema_matches(s, R"({"a": [1, 2]})"));
  EXPECT_TRUE(schema_matches(s, "{\n\"a\" :\t[ 1 , 2 ]\n}"));
  EXPECT_FALSE(schema_matches(s, R"({"a":  [1]})"));
  EXPECT_FALSE(schema_matches(s, R"({"a": [1]})", {0, 0}));
  EXPECT_TRUE(schema_matches(s, R"({"a":[1]})", {0, 0}));
  EXPECT_TRUE(schema_matches(s, "\n\n{\"a\":  [1]}", {2, 2}));
  EXPECT_FALSE(schema_matches(s, " {}", {1, 0}));
}

TEST(StructuredSchema, ArraysCounted) {
  const std::string s = R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})";
  EXPECT_FALSE(schema_matches(s, "[]"));
  EXPECT_TRUE(schema_matches(s, "[true]"));
  EXPECT_TRUE(schema_matches(s, "[true,false,true]"));
  EXPECT_FALSE(schema_matches(s, "[true,false,true,true]"));
  EXPECT_TRUE(schema_matches(R"({"type":"array","minItems":2})", R"([1,"x",{}])"));
  EXPECT_FALSE(schema_matches(R"({"type":"array","minItems":2})", "[1]"));
}

TEST(StructuredSchema, RecursiveReferences) {
  const std::string s = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})";
  EXPECT_TRUE(schema_matches(s, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(schema_matches(s, R"({"v":1,"kids":[{"kids":[]}]})"));
  const std::string root = R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})";
  EXPECT_TRUE(schema_matches(root, R"({"next":{"next":{"next":null}}})"));
  EXPECT_TRUE(schema_matches(R"({"definitions":{"x":{"type":"null"}},"$ref":"#/definitions/x"})", "null"));
}

TEST(StructuredSchema, JsonModeAndChoice) {
  EXPECT_TRUE(matches(Spec::json_object(), "{}"));
  EXPECT_TRUE(matches(Spec::json_object(), R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(matches(Spec::json_object(), "[]"));
  EXPECT_FALSE(matches(Spec::json_object(), R"({"a":})"));
  EXPECT_TRUE(matches(Spec::choice({"yes", "no", "yes please"}), "yes"));
  EXPECT_TRUE(matches(Spec::choice({"yes", "no", "yes please"}), "yes please"));
  EXPECT_FALSE(matches(Spec::choice({"yes", "no"}), "ye"));
  EXPECT_FALSE(matches(Spec::choice({"yes", "no"}), "yess"));
  EXPECT_THROW(compiler().make(Spec::choice({})), Error);
}

TEST(StructuredSchema, FinishedOnlyWhenNothingMayFollow) {
  const std::shared_ptr<TokenConstraint> c = compiler().make(Spec::choice({"ab", "abc"}));
  EXPECT_TRUE(c->accept('a'));
  EXPECT_TRUE(c->accept('b'));
  EXPECT_TRUE(c->accepting());
  EXPECT_FALSE(c->finished());
  EXPECT_FALSE(c->accept('x'));  // refused, state unchanged
  EXPECT_TRUE(c->accept('c'));
  EXPECT_TRUE(c->finished());
  EXPECT_TRUE(c->accept(256));  // the end token
}

TEST(StructuredSchema, CompileCacheSharesGrammars) {
  Compiler c(testing::byte_vocab());
  const Spec spec = Spec::json_schema(R"({"type":"string"})");
  EXPECT_EQ(c.compile(spec), c.compile(spec));
  EXPECT_NE(c.compile(spec), c.compile(Spec::json_schema(R"({"type":"string"})", {0, 0})));
  EXPECT_EQ(c.n_cached(), 2u);
}

TEST(StructuredSchema, GrownGrammarsAreReplaced) {
  Compiler c(testing::byte_vocab(), 256, 40);
  const Spec spec = Spec::json_object();
  const auto first = c.compile(spec);
  std::shared_ptr<TokenConstraint> walk = std::make_shared<GrammarConstraint>(first);
  for (const char ch : std::string(R"({"a": [[[{"b": [1, 2.5e3, "x\n"]}]]], "c": {"d": null}})")) ASSERT_TRUE(walk->accept(ch));
  ASSERT_GT(first->n_states(), 40u);
  const auto second = c.compile(spec);
  EXPECT_NE(first, second);
  EXPECT_EQ(second, c.compile(spec));
  EXPECT_TRUE(walk->accepting());  // the old grammar lives on with its sequence
}

TEST(StructuredSchema, AnnotationsIgnored) {
  EXPECT_TRUE(schema_matches(R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","title":"t",
      "description":"d","examples":["e"],"default":"f","$comment":"c","type":"string"})", R"("z")"));
}

TEST(StructuredSchema, RefusalsNameKeywordAndPointer) {
  struct Case {
    const char* schema;
    const char* keyword;
    const char* pointer;
  };
  const Case cases[] = {
      {R"({"type":"string","pattern":"a+"})", "pattern", "/pattern"},
      {R"({"properties":{"a":{"type":"string","format":"email"}}})", "format", "/properties/a/format"},
      {R"({"type":"object","minProperties":1})", "minProperties", "/minProperties"},
      {R"({"allOf":[{"type":"string"}]})", "allOf", "/allOf"},
      {R"({"not":{"type":"string"}})", "not", "/not"},
      {R"({"type":"array","prefixItems":[{}]})", "prefixItems", "/prefixItems"},
      {R"({"type":"array","items":[{}]})", "items", "/items"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems", "/uniqueItems"},
      {R"({"type":"number","minimum":0})", "minimum", "/minimum"},
      {R"({"type":"number","multipleOf":2})", "multipleOf", "/multipleOf"},
      {R"({"oneOf":[{"type":"integer"},{"type":"number"}]})", "oneOf", "/oneOf"},
      {R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":2}]})", "oneOf", "/oneOf"},
      {R"({"$ref":"https://example.com/s.json"})", "$ref", "/$ref"},
      {R"({"$ref":"#/$defs/missing"})", "$ref", "/$ref"},
      {R"({"type":"text"})", "type", "/type"},
      {R"({"properties":{"a/b":{"type":"array","items":{"contains":{}}}}})", "contains", "/properties/a~1b/items/contains"},
      {R"({"$defs":{"x":{"if":{}}},"$ref":"#/$defs/x"})", "if", "/$defs/x/if"},
      {R"({"type":"string","maxLength":100000})", "maxLength", "/maxLength"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "required", "/required"},
      {R"({"type":"string","anyOf":[{"maxLength":2}]})", "anyOf", "/anyOf"},
      {R"({"patternProperties":{"x":{}}})", "patternProperties", "/patternProperties"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "maximum", "/maximum"},
      {R"({"anyOf":[{"type":"null"},{"dependentRequired":{}}]})", "dependentRequired", "/anyOf/1/dependentRequired"},
  };
  for (const Case& c : cases) {
    try {
      compiler().compile(Spec::json_schema(c.schema));
      ADD_FAILURE() << c.schema << " compiled";
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), c.keyword) << c.schema << ": " << e.what();
      EXPECT_EQ(e.pointer(), c.pointer) << c.schema << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.keyword), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("#") + c.pointer), std::string::npos) << e.what();
    }
  }
  try {
    compiler().compile(Spec::json_schema("false"));
    ADD_FAILURE() << "false compiled";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.pointer(), "");
  }
  EXPECT_THROW(compiler().compile(Spec::json_schema("{\"type\":")), SchemaError);
}

TEST(StructuredSchema, AfterReasoningGate) {
  const int n = compiler().vocab().size();
  const std::vector<int32_t> end_of_reasoning = {'<', '<', '/'};
  AfterReasoning c(compiler().make(Spec::choice({"ok"})), end_of_reasoning, n, {256});
  std::vector<uint32_t> words(token_mask_words(n));
  auto allowed = [&](int32_t t) { return (words[t >> 5] >> (t & 31)) & 1u; };
  c.fill_mask(words);
  for (int32_t t = 0; t < 256; ++t) EXPECT_TRUE(allowed(t)) << t;
  EXPECT_FALSE(allowed(256));
  EXPECT_FALSE(c.accept(256));
  for (const char ch : std::string("think <x</<<<")) EXPECT_TRUE(c.accept(static_cast<uint8_t>(ch)));
  EXPECT_TRUE(c.reasoning());  // "<</" not yet spelled
  EXPECT_TRUE(c.accept('/'));
  EXPECT_FALSE(c.reasoning());
  c.fill_mask(words);
  for (int32_t t = 0; t < n; ++t) EXPECT_EQ(allowed(t), t == 'o') << t;
  EXPECT_TRUE(c.accept('o'));
  EXPECT_TRUE(c.accept('k'));
  EXPECT_TRUE(c.finished());
}

TEST(StructuredSchema, FramedByAddedTokens) {
  std::vector<std::string> bytes;
  std::vector<bool> text;
  for (int b = 0; b < 256; ++b) {
    bytes.push_back(std::string(1, static_cast<char>(b)));
    text.push_back(true);
  }
  for (const char* special : {"<eos>", "<tool_call>", "</tool_call>"}) {
    bytes.push_back(special);
    text.push_back(false);
  }
  Compiler compiler(Vocabulary(bytes, text, {256}));
  const Spec spec = Spec::json_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})", {0, 1, 1});
  Framed c(compiler.make(spec), {257}, {258}, 259, {256});
  std::vector<uint32_t> words(token_mask_words(259));
  auto allowed = [&](int32_t t) {
    c.fill_mask(words);
    return ((words[t >> 5] >> (t & 31)) & 1u) != 0;
  };
  EXPECT_TRUE(allowed(257));
  EXPECT_FALSE(allowed('\n'));
  EXPECT_FALSE(c.accept('{'));
  EXPECT_TRUE(c.accept(257));
  for (const char ch : std::string("\n{\"a\":")) ASSERT_TRUE(c.accept(ch));
  EXPECT_FALSE(allowed(258));
  EXPECT_FALSE(c.accept(258));
  for (const char ch : std::string("12}")) ASSERT_TRUE(c.accept(ch));
  EXPECT_TRUE(allowed(258));
  EXPECT_TRUE(allowed('\n'));
  EXPECT_FALSE(allowed(256));  // the frame is not closed yet
  EXPECT_FALSE(c.accepting());
  EXPECT_FALSE(c.accept(256));
  EXPECT_TRUE(c.accept('\n'));
  EXPECT_TRUE(c.accept(258));
  EXPECT_TRUE(c.accepting());
  EXPECT_TRUE(c.finished());
  for (int32_t t = 0; t < 259; ++t) EXPECT_EQ(allowed(t), t == 256) << t;
  EXPECT_TRUE(c.accept(256));
}

}  // namespace
}  // namespace megadecode::structured
