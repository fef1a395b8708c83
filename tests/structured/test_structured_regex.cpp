// The regex subset against std::regex (ECMAScript) as the oracle: random ASCII strings are
// accepted exactly when std::regex_match accepts them, random walks on a synthetic vocabulary end
// in matching text (and their one-character mutations agree with the oracle), and unsupported
// syntax is an Error naming the offset.
// sanitize: address
#include <cstdio>
#include <regex>

#include <gtest/gtest.h>

#include "structured/compiler.h"
#include "structured_test_util.h"

namespace megadecode::structured {
namespace {

const std::vector<std::string> kPatterns = {
    R"(\d{3}-\d{4})",      "(yes|no)!?",         "[A-Z][a-z]+( [A-Z][a-z]+)*", "a{2}b?c{1,3}",
    R"([^"\n]{0,5})",      "x(ab|a)*b",          R"(\w+@\w+\.(com|org))",      "^(0|[1-9][0-9]*)$",
    "(?:ab|cd){2,}",       R"([a-c\-.]+\.?)",    "(a|b|)c",                    ".{2,4}",
};

bool matches(Compiler& compiler, const std::string& pattern, const std::string& text) {
  const std::shared_ptr<TokenConstraint> c = compiler.make(Spec::regex(pattern));
  for (const char ch : text)
    if (!c->accept(static_cast<uint8_t>(ch))) return false;
  return c->accepting();
}

// The oracle's pattern: `.` outside a class written [^\n] (the subset's `.` is any character but
// newline, as in Python's re, the regexes vLLM takes; ECMAScript's refuses \r too).
std::string oracle_pattern(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out += pattern.substr(i++, 2);
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out += c == '.' && !in_class ? std::string("[^\n]") : std::string(1, c);
  }
  return out;
}

TEST(StructuredRegex, AgreesWithStdRegex) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces it)\n", static_cast<unsigned long long>(seed));
  Compiler compiler(testing::byte_vocab());
  SplitMix64 rng(seed);
  const std::string alphabet = "abcxyzAB019-.@! \"\n";
  for (const std::string& pattern : kPatterns) {
    const std::regex oracle(oracle_pattern(pattern));
    int n_match = 0, n_walked = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      for (int n = static_cast<int>(rng.below(9)); n > 0; --n) s += alphabet[rng.below(alphabet.size())];
      const bool want = std::regex_match(s, oracle);
      n_match += want;
      ASSERT_EQ(matches(compiler, pattern, s), want) << "\"" << s << "\" against " << pattern;
    }
    // Strings that match, from walks: the oracle agrees with every completed one.
    Compiler walker(testing::synthetic_vocab(seed + 7, 1003));
    for (int i = 0; i < 40; ++i) {
      const std::shared_ptr<TokenConstraint> c = walker.make(Spec::regex(pattern));
      const testing::Walk w = testing::random_walk(*c, walker.vocab(), rng, 60);
      ASSERT_TRUE(w.error.empty()) << w.error << " for " << pattern;
      bool ascii = true;  // std::regex reads bytes: `.` and [^...] differ on UTF-8
      for (const char ch : w.text) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
      if (w.complete && ascii) {
        EXPECT_TRUE(std::regex_match(w.text, oracle)) << "\"" << w.text << "\" against " << pattern;
        ++n_walked;
        for (int m = 0; m < 20; ++m) {  // near misses: one character changed, dropped or added
          std::string t = w.text;
          const size_t at = rng.below(t.size() + 1);
          const char ch = alphabet[rng.below(alphabet.size())];
          const uint64_t op = t.empty() ? 2 : rng.below(3);
          if (op == 0 && at < t.size()) t[at] = ch;
          if (op == 1 && at < t.size()) t.erase(at, 1);
          if (op == 2) t.insert(at, 1, ch);
          ASSERT_EQ(matches(compiler, pattern, t), std::regex_match(t, oracle)) << "\"" << t << "\" against " << pattern;
        }
      }
    }
    std::printf("%-28s %4d of 3000 random strings match, %d walks checked\n", pattern.c_str(), n_match, n_walked);
  }
}

TEST(StructuredRegex, Utf8AndDot) {
  Compiler compiler(testing::byte_vocab());
  EXPECT_TRUE(matches(compiler, "é+中", "éé中"));
  EXPECT_TRUE(matches(compiler, ".", "中"));
  EXPECT_TRUE(matches(compiler, "[^a]", "\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(compiler, ".", "\n"));
  EXPECT_FALSE(matches(compiler, ".", "\xC0\x80"));
}

TEST(StructuredRegex, UnsupportedSyntaxRefused) {
  Compiler compiler(testing::byte_vocab());
  for (const char* bad : {"(?=a)b", R"((a)\1)", R"(\bword)", R"(\D)", "[é]", "a{3,1}", "(ab", "a{999}", "*a", "[a-"}) {
    try {
      compiler.compile(Spec::regex(bad));
      ADD_FAILURE() << bad << " compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace megadecode::structured
