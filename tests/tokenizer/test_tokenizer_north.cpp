// Conformance of the tokenizer stages North Mini Code's tokenizer.json uses, against the JavaScript
// reference (scripts/tokenizer_reference.mjs with @lenml/tokenizers): synthetic tokenizer.json files
// with a 262,144-token vocabulary (north_tokenizer.h) and North's pipeline or a variant of it,
// exact token ids and decoded text on generated corpora.
#include <cstdio>
#include <sstream>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "north_tokenizer.h"
#include "bench/sample_text.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::escaped;

constexpr uint64_t kCorpusSeed = 20261206;  // the fixed corpus; a fresh random one is added per run
constexpr uint64_t kVocabSeed = 45;
constexpr int kMaxReported = 10;

// Text that exercises North's stages: digit runs in every context, letter case runs with marks
// and contractions, numbers of other scripts, whitespace runs, slashes, and the added tokens with
// whitespace around them.
std::string north_sample(SplitMix64& rng) {
  static const char* const kFragments[] = {
      "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234", "3.14159", "1,234,567",
      "x12345", "12345x", "12_345", "_12345", "v2", "2026-12-06", "$1000000", "1234é", "1234\u00A0",
      "\u0661\u0662\u0663\u0664", "12\u0663" "4", "\u216B\u2163", "\u00BD", "\U0001D7D9\U0001D7DA", "0x1F",
      "don't", "I'M", "you'Re", "THEY'LL", "we'VE", "'d", "'", "''s", "HelloWorld", "camelCase",
      "XMLHttpRequest", "ALLCAPS", "\u01C5ungla", "\u01C8", "\u02B0\u02B2a", "\u00E9", "e\u0301", "A\u0308",
      "\u0301abc", "\u0928\u092E\u0938\u094D\u0924\u0947", "\u4E2D\u6587\u5B57", "\u3042\u30AB", "\u0391\u03B2\u03B3",
      "\u0645\u0631\u062D\u0628\u0627", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "   \n  ", "\u00A0",
      "\u3000", "\uFEFF", "/", "//", "a/b", "/\n", "!\n", " ?!", "#include", "->", "::", "\\", "{\"a\": 1}",
      "<co: 1>", "</co>", "<c", "[TOOL", "TOOL]", "\U0001F600", "\U0001F468\u200D\U0001F469",
  };
  constexpr size_t kNumFragments = sizeof(kFragments) / sizeof(kFragments[0]);
  std::string s;
  const int n = 1 + static_cast<int>(rng.below(12));
  for (int k = 0; k < n; ++k) {
    const uint64_t r = rng.below(100);
    if (r < 15) {
      const auto& low = testing::north_low_tokens();
      const auto& turn = testing::north_turn_tokens();
      const size_t pick = rng.below(low.size() + turn.size());
      s += pick < low.size() ? low[pick].content : turn[pick - low.size()].content;
    } else if (r < 25) {
      s += std::to_string(rng.below(uint64_t{1} << (4 * (1 + rng.below(15)))));
    } else {
      s += kFragments[rng.below(kNumFragments)];
    }
    static const char* const kSeparators[] = {"", "", " ", "  ", "\n", "\t"};
    s += kSeparators[rng.below(6)];
  }
  return s;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s << (i ? "," : "") << ids[i];
  if (ids.size() > 40) s << ",...(" << ids.size() << ")";
  return s.str();
}

// Encodes texts with the tokenizer.json `tokenizer` here and in the reference; every id sequence
// (with <BOS_TOKEN>, as the reference adds special tokens) and every decoding must be equal. With check_roundtrip (a pipeline that adds no prefix space),
// decode(encode(s)) must also give back s with NFC applied between added tokens, for every s
// without a token that strips whitespace.
void expect_matches_reference(const std::string& name, const json& tokenizer, const std::vector<std::string>& texts,
                              bool check_roundtrip = false) {
  const auto dir = testing::write_north_tokenizer(name, tokenizer);
  const auto tok = Tokenizer::load(dir);
  const json results = testing::run_reference("encode", json(texts), dir);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(results.size(), texts.size());
  EXPECT_EQ(tok->vocab_size(), testing::kNorthVocabSize);
  EXPECT_EQ(tok->eos_token_id(), std::optional<int32_t>(255001));
  EXPECT_EQ(tok->encode("", true), (std::vector<int32_t>{5}));  // <BOS_TOKEN> for completions
  int mismatches = 0, decode_mismatches = 0, roundtrip_failures = 0;
  size_t n_tokens = 0, n_bytes = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = results[i]["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tok->encode(texts[i], true);
    n_tokens += ids.size();
    n_bytes += texts[i].size();
    if (ids != expected && ++mismatches <= kMaxReported) {
      ADD_FAILURE() << name << ": string " << i << " \"" << escaped(texts[i]) << "\"\n  ours:      " << ids_text(ids)
                    << "\n  reference: " << ids_text(expected);
    }
    const std::string decoded = tok->decode(expected, false);
    if (decoded != results[i]["decoded"].get<std::string>() && ++decode_mismatches <= kMaxReported) {
      ADD_FAILURE() << name << ": decode of string " << i << " \"" << escaped(texts[i]) << "\"\n  ours:      \""
                    << escaped(decoded) << "\"\n  reference: \"" << escaped(results[i]["decoded"].get<std::string>())
                    << "\"";
    }
    const bool strips = texts[i].find("STRIP|>") != std::string::npos;
    const std::string roundtrip = results[i]["roundtrip"].get<std::string>();
    if (check_roundtrip && !strips && tok->decode(tok->encode(texts[i], false), false) != roundtrip &&
        ++roundtrip_failures <= kMaxReported) {
      ADD_FAILURE() << name << ": decode(encode(s)) differs for string " << i << " \"" << escaped(texts[i]) << "\"";
    }
  }
  std::printf("%s: %zu strings, %zu bytes, %zu tokens, %d id mismatches, %d decode mismatches\n", name.c_str(),
              texts.size(), n_bytes, n_tokens, mismatches, decode_mismatches);
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(decode_mismatches, 0);
  EXPECT_EQ(roundtrip_failures, 0);
}

std::vector<std::string> corpus(uint64_t seed, int n_per_kind, int n_north) {
  std::vector<std::string> texts = sample_text::corpus(kCorpusSeed, n_per_kind);
  for (std::string& s : sample_text::corpus(seed, 4)) texts.push_back(std::move(s));
  SplitMix64 fixed(kCorpusSeed), fresh(seed);
  for (int i = 0; i < n_north; ++i) texts.push_back(north_sample(i % 2 == 0 ? fixed : fresh));
  return texts;
}

json split(SplitPattern pattern, const char* behavior, bool invert = false) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", std::string(split_pattern_regex(pattern))}}},
          {"behavior", behavior},
          {"invert", invert}};
}
json byte_level(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", use_regex}};
}
json sequence(std::initializer_list<json> stages) { return {{"type", "Sequence"}, {"pretokenizers", json(stages)}}; }

TEST(NorthTokenizerConformance, NorthPipeline) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces the random part)\n", static_cast<unsigned long long>(seed));
  const std::vector<std::string> texts = corpus(seed, 100, 1200);
  ASSERT_GE(texts.size(), 2000u);
  expect_matches_reference("north", testing::north_tokenizer_json(kVocabSeed, testing::north_pre_tokenizer()), texts,
                           /*check_roundtrip=*/true);
}

// Command R/A's pipeline (transformers tokenization_cohere): Digits, then ByteLevel with its regex.
TEST(NorthTokenizerConformance, DigitsAndByteLevelRegex) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const std::vector<std::string> texts = corpus(seed, 20, 300);
  for (const bool individual : {true, false}) {
    for (const bool prefix : {false, true}) {
      const json pre = sequence({{{"type", "Digits"}, {"individual_digits", individual}}, byte_level(prefix, true)});
      expect_matches_reference(cat("digits", individual, "-prefix", prefix),
                               testing::north_tokenizer_json(kVocabSeed, pre), texts);
    }
  }
}

// The behaviours the reference implements as HF does: Removed, and invert with Removed (which keeps
// only the matches); ByteLevel alone and after the Qwen2 split.
TEST(NorthTokenizerConformance, RemovedInvertAndByteLevelAlone) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const std::vector<std::string> texts = corpus(seed, 10, 300);
  const std::vector<std::pair<std::string, json>> variants = {
      {"removed", sequence({split(SplitPattern::kDigitGroups, "Removed"), split(SplitPattern::kGpt4o, "Isolated"),
                            byte_level(false, false)})},
      {"invert", sequence({split(SplitPattern::kDigitGroups, "Removed", true), byte_level(false, false)})},
      {"bytelevel", byte_level(false, true)},
      {"qwen2-prefix", sequence({split(SplitPattern::kQwen2, "Isolated"), byte_level(true, false)})},
      {"o200k-spelling", sequence({split(SplitPattern::kDigitGroups, "Isolated"),
                                   {{"type", "Split"},
                                    {"pattern", {{"Regex", testing::o200k_spelling()}}},
                                    {"behavior", "Isolated"},
                                    {"invert", false}},
                                   byte_level(false, false)})},
  };
  for (const auto& [name, pre] : variants) expect_matches_reference(name, testing::north_tokenizer_json(kVocabSeed, pre), texts);
}

}  // namespace
}  // namespace megadecode
