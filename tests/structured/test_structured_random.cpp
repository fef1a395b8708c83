// Random schemas of the supported subset on a synthetic 1,003-token vocabulary: every walk that
// completes parses and validates against its schema; the end token is allowed exactly when the
// grammar accepts; the mask and accept() agree on every token (exactness) on random states.
// sanitize: address
#include <cstdio>

#include <gtest/gtest.h>

#include "structured/matcher.h"
#include "structured_test_util.h"

namespace megadecode::structured {
namespace {

using testing::Json;

// Parses and validates; "" when valid. Numbers too large for a double are valid JSON (the parser
// refuses them; they are counted, not failed).
std::string check_output(const std::string& text, const Json& schema, int& n_overflow) {
  Json v;
  try {
    v = Json::parse(text);
  } catch (const nlohmann::json::out_of_range&) {
    ++n_overflow;
    return "";
  } catch (const nlohmann::json::exception& e) {
    return std::string("does not parse: ") + e.what();
  }
  return testing::validate(v, schema, schema);
}

TEST(StructuredRandom, ThousandSchemasValidate) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces it)\n", static_cast<unsigned long long>(seed));
  Compiler compiler(testing::synthetic_vocab(seed, 1003));
  testing::SchemaGenerator gen(seed);
  SplitMix64 rng(seed ^ 0x5eed);
  int n_complete = 0, n_overflow = 0, n_failed = 0;
  const int n_schemas = 1000;
  for (int i = 0; i < n_schemas && n_failed < 5; ++i) {
    const Json schema = gen.schema();
    const Options options{static_cast<int>(rng.below(3)), static_cast<int>(rng.below(2))};
    std::shared_ptr<TokenConstraint> c;
    try {
      c = compiler.make(Spec::json_schema(schema.dump(), options));
    } catch (const Error& e) {
      ADD_FAILURE() << "schema " << i << " refused: " << e.what() << "\n" << schema.dump();
      ++n_failed;
      continue;
    }
    const testing::Walk w = testing::random_walk(*c, compiler.vocab(), rng, 400);
    if (!w.error.empty()) {
      ADD_FAILURE() << "schema " << i << ": " << w.error << " after \"" << w.text << "\"\n" << schema.dump();
      ++n_failed;
      continue;
    }
    if (!w.complete) continue;
    ++n_complete;
    if (const std::string why = check_output(w.text, schema, n_overflow); !why.empty()) {
      ADD_FAILURE() << "schema " << i << ": output " << w.text << " fails: " << why << "\n" << schema.dump();
      ++n_failed;
    }
  }
  std::printf("%d of %d walks complete (%d with numbers beyond a double)\n", n_complete, n_schemas, n_overflow);
  EXPECT_GE(n_complete, n_schemas * 8 / 10);
}

TEST(StructuredRandom, MaskEqualsAccept) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces it)\n", static_cast<unsigned long long>(seed));
  Compiler compiler(testing::synthetic_vocab(seed + 1, 1003));
  const Vocabulary& vocab = compiler.vocab();
  testing::SchemaGenerator gen(seed + 1);
  SplitMix64 rng(seed + 2);
  std::vector<uint32_t> words(token_mask_words(vocab.size()));
  int n_checked = 0;
  for (int i = 0; i < 60; ++i) {
    const Json schema = gen.schema();
    GrammarConstraint c(compiler.compile(Spec::json_schema(schema.dump(), {static_cast<int>(rng.below(2)), 0})));
    for (int step = 0; step < 40 && !c.finished(); ++step) {
      c.fill_mask(words);
      if (step % 3 == 0) {
        for (int32_t t = 0; t < vocab.size(); ++t) {
          GrammarConstraint copy = c;
          ASSERT_EQ(copy.accept(t), testing::bit(words, t))
              << "token " << t << " \"" << vocab.bytes(t) << "\" at step " << step << " of " << schema.dump();
        }
        ++n_checked;
      }
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab.size(); ++t)
        if (testing::bit(words, t) && !vocab.is_end(t)) allowed.push_back(t);
      if (allowed.empty()) break;
      ASSERT_TRUE(c.accept(allowed[rng.below(allowed.size())]));
    }
  }
  std::printf("%d states checked token by token\n", n_checked);
}

}  // namespace
}  // namespace megadecode::structured
