// The grammar engine on the real Qwen3 vocabulary (151,669 tokens, data/tokenizer/qwen3): tokens
// that straddle JSON structure ("\"}", "\",", "\":\"") are allowed exactly where the grammar goes
// on through them; added and special tokens never are; random walks of a tool-call schema
// validate; the mask equals accept() on every token of sampled states.
#include <cstdio>

#include <gtest/gtest.h>

#include "../tokenizer/tokenizer_test_util.h"
#include "structured/matcher.h"
#include "structured_test_util.h"

namespace megadecode::structured {
namespace {

using testing::Json;

const std::shared_ptr<const Vocabulary>& qwen3_vocab() {
  static const std::shared_ptr<const Vocabulary> vocab = [] {
    const Tokenizer& tok = megadecode::testing::qwen3();
    return std::make_shared<const Vocabulary>(
        Vocabulary::from_tokenizer(tok, {*tok.token_id("<|im_end|>"), *tok.token_id("<|endoftext|>")}));
  }();
  return vocab;
}

int32_t token_of(const std::string& bytes) {
  const Vocabulary& v = *qwen3_vocab();
  for (int32_t id = 0; id < v.size(); ++id)
    if (v.is_text(id) && v.bytes(id) == bytes) return id;
  return -1;
}

// The constraint after the text, fed as the tokenizer splits it.
GrammarConstraint after(const std::string& schema, const std::string& text) {
  Compiler compiler(qwen3_vocab());
  GrammarConstraint c(compiler.compile(Spec::json_schema(schema, {0, 0})));
  for (const int32_t id : megadecode::testing::qwen3().encode(text, false))
    EXPECT_TRUE(c.accept(id)) << "token " << id << " of " << text;
  return c;
}

bool allows(const GrammarConstraint& c, int32_t id) {
  std::vector<uint32_t> words(token_mask_words(qwen3_vocab()->size()));
  c.fill_mask(words);
  return testing::bit(words, id);
}

TEST(StructuredQwen3, TokensThatStraddleStructure) {
  const int32_t close_brace = token_of("\"}"), comma = token_of("\","), colon = token_of("\":\"");
  ASSERT_GE(close_brace, 0);
  ASSERT_GE(comma, 0);
  ASSERT_GE(colon, 0);
  const std::string one = R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})";
  const std::string two = R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"required":["a"]})";
  EXPECT_TRUE(allows(after(one, R"({"a":"xy)"), close_brace));
  EXPECT_FALSE(allows(after(one, R"({"a":"xy)"), comma));  // no second property
  EXPECT_TRUE(allows(after(two, R"({"a":"xy)"), comma));
  EXPECT_TRUE(allows(after(two, R"({"a":"xy)"), close_brace));
  EXPECT_TRUE(allows(after(two, R"({"a":"xy","b)"), colon));
  EXPECT_FALSE(allows(after(two, R"({"a":"xy","b":"z)"), comma));  // b was the last property
  const std::string short_str = R"({"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":4}},"required":["a"]})";
  EXPECT_FALSE(allows(after(short_str, R"({"a":"xy)"), close_brace));  // too short yet
  EXPECT_TRUE(allows(after(short_str, R"({"a":"xyz)"), close_brace));
  GrammarConstraint c = after(one, R"({"a":"xy)");
  EXPECT_TRUE(c.accept(close_brace));
  EXPECT_TRUE(c.finished());
}

TEST(StructuredQwen3, SpecialTokensNeverAllowed) {
  const Tokenizer& tok = megadecode::testing::qwen3();
  const Vocabulary& v = *qwen3_vocab();
  Compiler compiler(qwen3_vocab());
  GrammarConstraint c(compiler.compile(Spec::json_object()));
  std::vector<uint32_t> words(token_mask_words(v.size()) + 9);  // the model's padded rows too
  for (const std::string& text : {std::string(""), std::string(R"({"a": "x <)"), std::string(R"({"a": [1, {})")}) {
    GrammarConstraint s = c;
    for (const int32_t id : tok.encode(text, false)) ASSERT_TRUE(s.accept(id)) << text;
    s.fill_mask(words);
    EXPECT_TRUE(testing::bit(words, *tok.token_id("<|im_end|>")) == s.accepting());
    for (int32_t id = 0; id < v.size(); ++id) {
      if (tok.is_added_token(id) && !v.is_end(id)) {
        EXPECT_FALSE(testing::bit(words, id)) << id << " after " << text;
      }
    }
    for (size_t w = token_mask_words(v.size()); w < words.size(); ++w) EXPECT_EQ(words[w], 0u);
  }
}

TEST(StructuredQwen3, ToolCallWalksValidate) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces it)\n", static_cast<unsigned long long>(seed));
  const Json schema = Json::parse(R"({"type":"object","properties":{
      "name":{"const":"get_weather"},
      "arguments":{"type":"object","properties":{
        "location":{"type":"string","maxLength":40},"unit":{"enum":["celsius","fahrenheit"]},
        "days":{"type":"integer","minimum":1,"maximum":14},"when":{"type":"string","format":"date"},
        "tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["location"]}},
      "required":["name","arguments"]})");
  Compiler compiler(qwen3_vocab());
  const auto grammar = compiler.compile(Spec::json_schema(schema.dump(), {1, 0}));
  SplitMix64 rng(seed);
  std::vector<uint32_t> words(token_mask_words(qwen3_vocab()->size()));
  int n_complete = 0;
  for (int i = 0; i < 30; ++i) {
    GrammarConstraint c(grammar);
    const testing::Walk w = testing::random_walk(c, *qwen3_vocab(), rng, 300);
    ASSERT_TRUE(w.error.empty()) << w.error << " after " << w.text;
    if (!w.complete) continue;
    ++n_complete;
    const Json v = Json::parse(w.text);
    EXPECT_EQ(testing::validate(v, schema, schema), "") << w.text;
  }
  EXPECT_GE(n_complete, 20);
  // Exactness on a few states: accept() agrees with the mask on every token.
  GrammarConstraint c(grammar);
  for (int step = 0; step < 12 && !c.finished(); ++step) {
    c.fill_mask(words);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < qwen3_vocab()->size(); ++t) {
      GrammarConstraint copy = c;
      ASSERT_EQ(copy.accept(t), testing::bit(words, t)) << "token " << t << " at step " << step;
      if (testing::bit(words, t) && !qwen3_vocab()->is_end(t)) allowed.push_back(t);
    }
    ASSERT_FALSE(allowed.empty());
    ASSERT_TRUE(c.accept(allowed[rng.below(allowed.size())]));
  }
}

}  // namespace
}  // namespace megadecode::structured
