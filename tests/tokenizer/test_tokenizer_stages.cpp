// sanitize: address
// Unit tests of the tokenizer stages beyond Qwen3's, on hand-checked awkward inputs: the split
// patterns (North's digit groups and GPT-4o-style split, GPT-2's), every Split delimiter behaviour
// with and without invert (the examples of the HF tokenizers documentation), Digits, ByteLevel's
// prefix space and regex, the added-token flags, decode round trips, and the stages and options
// that are still refused by name when a tokenizer loads.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/rng.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "bench/sample_text.h"
#include "tokenizer/split_patterns.h"
#include "north_tokenizer.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

using nlohmann::json;
using Strings = std::vector<std::string>;
using testing::expect_load_error;

// The matches of pattern in text, in order, with the gaps between them.
Strings split_isolated(SplitPattern pattern, std::string_view text) {
  PreTokenizerStage stage;
  stage.pattern = pattern;
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  PreTokenizer({stage}).run(text, pieces, arena);
  return Strings(pieces.begin(), pieces.end());
}

Strings run(const std::vector<PreTokenizerStage>& stages, std::string_view text) {
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  PreTokenizer(stages).run(text, pieces, arena);
  return Strings(pieces.begin(), pieces.end());
}

TEST(SplitPatterns, RecognisedByExactText) {
  for (const SplitPattern p : {SplitPattern::kQwen2, SplitPattern::kGpt2, SplitPattern::kDigitGroups, SplitPattern::kGpt4o}) {
    EXPECT_EQ(split_pattern_from_regex(split_pattern_regex(p)), p);
  }
  EXPECT_EQ(split_pattern_from_regex(testing::o200k_spelling()), SplitPattern::kGpt4o);  // o200k's spelling
  EXPECT_EQ(split_pattern_from_regex(R"(\d{1,3})"), std::nullopt);
  EXPECT_EQ(split_pattern_from_regex(""), std::nullopt);
}

TEST(SplitPatterns, DigitGroupsFromTheRight) {
  const auto p = SplitPattern::kDigitGroups;
  EXPECT_EQ(split_isolated(p, "1234567"), (Strings{"1", "234", "567"}));
  EXPECT_EQ(split_isolated(p, "123"), (Strings{"123"}));
  EXPECT_EQ(split_isolated(p, "12345 x"), (Strings{"12", "345", " x"}));
  EXPECT_EQ(split_isolated(p, "12.3456"), (Strings{"12", ".", "3", "456"}));
  // \b after the run: a letter, digit or _ right after it leaves the whole run unsplit.
  EXPECT_EQ(split_isolated(p, "12345x"), (Strings{"12345x"}));
  EXPECT_EQ(split_isolated(p, "1234_5"), (Strings{"1234_", "5"}));  // then "5" ends the text
  EXPECT_EQ(split_isolated(p, "ab1234cd 56"), (Strings{"ab1234cd ", "56"}));
  EXPECT_EQ(split_isolated(p, "_12345"), (Strings{"_", "12", "345"}));
  // ASCII \d and \b, as JavaScript runs the pattern: a non-ASCII letter ends a word, other
  // scripts' digits are not \d.
  EXPECT_EQ(split_isolated(p, "1234\u00E9"), (Strings{"1", "234", "\u00E9"}));
  EXPECT_EQ(split_isolated(p, "\u0661\u0662\u0663\u0664"), (Strings{"\u0661\u0662\u0663\u0664"}));
  EXPECT_EQ(split_isolated(p, ""), (Strings{}));
}

TEST(SplitPatterns, Gpt4oStyle) {
  const auto p = SplitPattern::kGpt4o;
  EXPECT_EQ(split_isolated(p, "HelloWorld"), (Strings{"Hello", "World"}));
  EXPECT_EQ(split_isolated(p, "XMLHttpRequest"), (Strings{"XMLHttp", "Request"}));
  EXPECT_EQ(split_isolated(p, "ALLCAPS don't I'M"), (Strings{"ALLCAPS", " don't", " I'M"}));
  EXPECT_EQ(split_isolated(p, "  hello"), (Strings{" ", " hello"}));
  EXPECT_EQ(split_isolated(p, "1234567"), (Strings{"123", "456", "7"}));
  EXPECT_EQ(split_isolated(p, "a/b"), (Strings{"a", "/b"}));
  EXPECT_EQ(split_isolated(p, "!!\n\nx"), (Strings{"!!\n\n", "x"}));
  EXPECT_EQ(split_isolated(p, "x=1;//\n"), (Strings{"x", "=", "1", ";//\n"}));
  EXPECT_EQ(split_isolated(p, "a  \n b"), (Strings{"a", "  \n", " b"}));
  EXPECT_EQ(split_isolated(p, "x   "), (Strings{"x", "   "}));
  // Titlecase, modifier letters and marks: U+01C5 is Lt, U+02B0 Lm, U+0301 Mn.
  EXPECT_EQ(split_isolated(p, "\u01C5ungla"), (Strings{"\u01C5ungla"}));
  EXPECT_EQ(split_isolated(p, "e\u0301t\u00E9"), (Strings{"e\u0301t\u00E9"}));
  EXPECT_EQ(split_isolated(p, "\u0301abc"), (Strings{"\u0301abc"}));
  // A*B+ gives back the modifier letter to B+ when nothing lower-case follows the upper run.
  EXPECT_EQ(split_isolated(p, "\u02B0A"), (Strings{"\u02B0", "A"}));
  EXPECT_EQ(split_isolated(p, "\u4E2D\u6587 \u0661\u0662\u0663\u0664"), (Strings{"\u4E2D\u6587", " ", "\u0661\u0662\u0663", "\u0664"}));
}

TEST(SplitPatterns, Gpt2) {
  const auto p = SplitPattern::kGpt2;
  EXPECT_EQ(split_isolated(p, "Hello world's 123 !!"), (Strings{"Hello", " world", "'s", " 123", " !!"}));
  EXPECT_EQ(split_isolated(p, "I'M"), (Strings{"I", "'", "M"}));  // contractions are lower case only
  EXPECT_EQ(split_isolated(p, "a  b"), (Strings{"a", " ", " b"}));
  EXPECT_EQ(split_isolated(p, "x\n\ny"), (Strings{"x", "\n", "\n", "y"}));
  EXPECT_EQ(split_isolated(p, "abc123"), (Strings{"abc", "123"}));
}

// The example of the HF tokenizers documentation: "the-final--countdown" split on "-".
std::vector<PreTokenizerStage> dash(SplitBehavior behavior, bool invert = false) {
  PreTokenizerStage stage;
  stage.literal = "-";
  stage.behavior = behavior;
  stage.invert = invert;
  return {stage};
}

TEST(SplitBehaviors, EachBehavior) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(run(dash(SplitBehavior::kRemoved), text), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kIsolated), text), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kMergedWithPrevious), text), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kMergedWithNext), text), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kContiguous), text), (Strings{"the", "-", "final", "--", "countdown"}));
  // Delimiters at the edges, and only delimiters.
  EXPECT_EQ(run(dash(SplitBehavior::kMergedWithPrevious), "-a-"), (Strings{"-", "a-"}));
  EXPECT_EQ(run(dash(SplitBehavior::kMergedWithNext), "-a-"), (Strings{"-a", "-"}));
  EXPECT_EQ(run(dash(SplitBehavior::kContiguous), "---"), (Strings{"---"}));
  EXPECT_EQ(run(dash(SplitBehavior::kRemoved), "---"), (Strings{}));
  EXPECT_EQ(run(dash(SplitBehavior::kIsolated), ""), (Strings{}));
}

TEST(SplitBehaviors, Invert) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(run(dash(SplitBehavior::kRemoved, true), text), (Strings{"-", "-", "-"}));
  EXPECT_EQ(run(dash(SplitBehavior::kIsolated, true), text), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kMergedWithPrevious, true), text), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kMergedWithNext, true), text), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run(dash(SplitBehavior::kContiguous, true), text), (Strings{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizerStages, DigitsAndByteLevel) {
  PreTokenizerStage digits;
  digits.type = PreTokenizerStage::Type::kDigits;
  digits.individual_digits = true;
  // \p{N} as Rust's char::is_numeric: other scripts' digits and superscripts too.
  EXPECT_EQ(run({digits}, "abc123def\u0663" "4\u00B2"), (Strings{"abc", "1", "2", "3", "def", "\u0663", "4", "\u00B2"}));
  digits.individual_digits = false;
  EXPECT_EQ(run({digits}, "abc123def\u0663" "4\u00B2"), (Strings{"abc", "123", "def", "\u0663" "4\u00B2"}));
  PreTokenizerStage byte_level;
  byte_level.type = PreTokenizerStage::Type::kByteLevel;
  byte_level.add_prefix_space = true;
  byte_level.use_regex = false;
  // The prefix space goes on every piece an earlier stage made that does not start with one.
  EXPECT_EQ(run({digits, byte_level}, "ab12 c"), (Strings{" ab", " 12", " c"}));
  EXPECT_EQ(run({byte_level}, " x"), (Strings{" x"}));
  byte_level.use_regex = true;
  EXPECT_EQ(run({byte_level}, "it's 42"), (Strings{" it", "'s", " 42"}));
  byte_level.add_prefix_space = false;
  EXPECT_EQ(run({byte_level}, "it's 42"), (Strings{"it", "'s", " 42"}));
}

// On random text of every kind, every pattern and behaviour keeps the text (all but Removed give
// pieces that concatenate to it), and no piece is empty.
TEST(SplitBehaviors, RandomTextIsKept) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const SplitBehavior behaviors[] = {SplitBehavior::kIsolated, SplitBehavior::kMergedWithPrevious,
                                     SplitBehavior::kMergedWithNext, SplitBehavior::kContiguous};
  for (int i = 0; i < 400; ++i) {
    const std::string text = sample_text::generate(static_cast<sample_text::Kind>(i % sample_text::kNumKinds), rng);
    for (const SplitPattern p : {SplitPattern::kQwen2, SplitPattern::kGpt2, SplitPattern::kDigitGroups, SplitPattern::kGpt4o}) {
      for (const SplitBehavior b : behaviors) {
        for (const bool invert : {false, true}) {
          PreTokenizerStage stage;
          stage.pattern = p;
          stage.behavior = b;
          stage.invert = invert;
          std::string joined;
          for (const std::string& piece : run({stage}, text)) {
            EXPECT_FALSE(piece.empty());
            joined += piece;
          }
          ASSERT_EQ(joined, text) << "pattern " << split_pattern_regex(p) << ", behavior " << static_cast<int>(b)
                                  << ", invert " << invert << ", text \"" << testing::escaped(text) << "\"";
        }
      }
    }
  }
}

// A tokenizer of the 256 bytes (id = byte), no merges, North's pre-tokenizer and added tokens
// with each flag.
std::filesystem::path flag_tokenizer(const std::string& name, const std::function<void(json&)>& edit) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<uint8_t>(b))] = b;
  auto token = [](int id, const char* content, bool special, bool single_word, bool lstrip, bool rstrip,
                  bool normalized) {
    return json{{"id", id},           {"content", content}, {"special", special},  {"single_word", single_word},
                {"lstrip", lstrip},   {"rstrip", rstrip},   {"normalized", normalized}};
  };
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const json split = [](SplitPattern p) {
    return json{{"type", "Split"}, {"pattern", {{"Regex", std::string(split_pattern_regex(p))}}}, {"behavior", "Isolated"}, {"invert", false}};
  }(SplitPattern::kGpt4o);
  json j = {{"added_tokens",
             {token(256, "<s>", true, false, false, false, false), token(257, "<L>", true, false, true, false, false),
              token(258, "<R>", true, false, false, true, false), token(259, "<W>", true, true, false, false, false),
              token(260, "\u00E9", false, false, false, false, true), token(261, "ab", false, false, false, false, false)}},
            {"normalizer", {{"type", "NFC"}}},
            {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
            {"post_processor", byte_level},
            {"decoder", byte_level},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  edit(j);
  const auto dir = std::filesystem::temp_directory_path() / ("megadecode-flags-" + name + "-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<s>"})";
  return dir;
}

std::vector<int32_t> bytes(std::string_view s) { return std::vector<int32_t>(s.begin(), s.end()); }
std::vector<int32_t> join(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(AddedTokenFlags, StripSingleWordNormalized) {
  const auto dir = flag_tokenizer("ok", [](json&) {});
  const auto tok = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  // lstrip takes the whitespace before the token (any JavaScript \s), rstrip the whitespace after.
  EXPECT_EQ(tok->encode("x \t\u3000<L> y", false), join({bytes("x"), {257}, bytes(" y")}));
  EXPECT_EQ(tok->encode("x <R> \n y", false), join({bytes("x "), {258}, bytes("y")}));
  EXPECT_EQ(tok->encode("<R>  <L>", false), (std::vector<int32_t>{258, 257}));
  EXPECT_EQ(tok->encode(" <s> ", false), join({bytes(" "), {256}, bytes(" ")}));
  // single_word: only where no word character touches the token.
  EXPECT_EQ(tok->encode(" <W>-", false), join({bytes(" "), {259}, bytes("-")}));
  EXPECT_EQ(tok->encode("<W>", false), (std::vector<int32_t>{259}));
  EXPECT_EQ(tok->encode("a<W>", false), bytes("a<W>"));
  EXPECT_EQ(tok->encode("<W>_", false), bytes("<W>_"));
  EXPECT_EQ(tok->encode("1<W>", false), bytes("1<W>"));
  EXPECT_EQ(tok->encode("\u00E7<W>", false), join({{0xC3, 0xA7}, bytes("<W>")}));
  // normalized: matched after NFC, so the decomposed form finds it too; a raw-text token is not
  // matched in what NFC makes of the text around it.
  EXPECT_EQ(tok->encode("e\u0301", false), (std::vector<int32_t>{260}));
  EXPECT_EQ(tok->encode("x\u00E9y", false), join({bytes("x"), {260}, bytes("y")}));
  EXPECT_EQ(tok->encode("xaby", false), join({bytes("x"), {261}, bytes("y")}));
  EXPECT_EQ(tok->token_id("\u00E9"), std::optional<int32_t>(260));
  EXPECT_EQ(tok->token_id("<W>"), std::optional<int32_t>(259));
  EXPECT_TRUE(tok->is_special(257));
  EXPECT_FALSE(tok->is_special(260));
  EXPECT_TRUE(tok->is_added_token(260));
  // Decode: added tokens as their text, special ones skipped on request.
  const std::vector<int32_t> ids = tok->encode("x <L>ab\u00E9<W> e\u0301!", false);
  EXPECT_EQ(tok->decode(ids, false), "x<L>ab\u00E9<W> \u00E9!");
  EXPECT_EQ(tok->decode(ids, true), "xab\u00E9<W> \u00E9!");  // <W> after a letter is plain text
}

// TemplateProcessing (North's BOS): its special tokens around the text only when encode adds them,
// inside a post-processor Sequence with ByteLevel.
TEST(PostProcessor, TemplateProcessing) {
  const auto dir = flag_tokenizer("template-ok", [](json& j) {
    const json item_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    j["post_processor"] = {
        {"type", "Sequence"},
        {"processors",
         {j["post_processor"],
          {{"type", "TemplateProcessing"},
           {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, item_a, {{"SpecialToken", {{"id", "<R>"}, {"type_id", 0}}}}}},
           {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}}}, {"<R>", {{"id", "<R>"}, {"ids", {258}}}}}}}}}};
  });
  const auto tok = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(tok->encode("hi", true), join({{256}, bytes("hi"), {258}}));
  EXPECT_EQ(tok->encode("hi", false), bytes("hi"));
  EXPECT_EQ(tok->encode("", true), (std::vector<int32_t>{256, 258}));
  EXPECT_EQ(tok->decode(tok->encode("hi", true), true), "hi");
}

TEST(PreTokenizerStages, UnimplementedStagesAreRefusedByName) {
  auto with_pre = [](const std::string& name, const json& stage) {
    return flag_tokenizer(name, [&](json& j) { j["pre_tokenizer"]["pretokenizers"][0] = stage; });
  };
  expect_load_error(with_pre("ws", {{"type", "Whitespace"}}),
                    "unsupported pre_tokenizer Sequence[Whitespace, ByteLevel]: the stage Whitespace is not implemented");
  expect_load_error(with_pre("meta", {{"type", "Metaspace"}, {"replacement", "_"}}), "the stage Metaspace is not implemented");
  expect_load_error(with_pre("punct", {{"type", "Punctuation"}}), "the stage Punctuation is not implemented");
  expect_load_error(with_pre("regex", {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}+"}}}, {"behavior", "Isolated"}}),
                    "the Split regex \"\\\\p{N}+\" is not one this tokenizer implements");
  expect_load_error(with_pre("behavior", {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Sideways"}}),
                    "unknown Split behavior \"Sideways\"");
  expect_load_error(flag_tokenizer("after", [](json& j) {
                      j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}, {"individual_digits", true}});
                    }),
                    "the stage Digits(individual_digits) follows ByteLevel");
  expect_load_error(flag_tokenizer("nobl", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }),
                    "needs ByteLevel as the last stage");
  expect_load_error(flag_tokenizer("none", [](json& j) { j["pre_tokenizer"] = nullptr; }),
                    "unsupported pre_tokenizer none");
  expect_load_error(flag_tokenizer("nfkc", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }),
                    "unsupported normalizer");
  expect_load_error(flag_tokenizer("roberta", [](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; }),
                    "unsupported post_processor RobertaProcessing: the processor RobertaProcessing is not implemented");
  expect_load_error(flag_tokenizer("template", [](json& j) {
                      j["post_processor"] = {{"type", "TemplateProcessing"},
                                             {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
                                             {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}}}}}};
                    }),
                    "TemplateProcessing's \"single\" template has no Sequence A");
  expect_load_error(flag_tokenizer("template-id", [](json& j) {
                      j["post_processor"] = {{"type", "TemplateProcessing"},
                                             {"single", {{{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}},
                                                         {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                                             {"special_tokens", {{"<x>", {{"id", "<x>"}, {"ids", {999}}}}}}};
                    }),
                    "the post_processor adds token id 999, which is not a token");
  // Supported: a Sequence of NFC normalizers, nested pre-tokenizer Sequences, a String pattern.
  const auto dir = flag_tokenizer("nested", [](json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Sequence"},
                             {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}}}}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  });
  const auto tok = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(tok->encode("a-b", false), bytes("ab"));
  EXPECT_EQ(tok->encode("e\u0301", false), (std::vector<int32_t>{260}));  // the Sequence's NFC
  // An empty normalizer Sequence normalizes nothing.
  const auto empty = flag_tokenizer("emptynorm", [](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}}; });
  const auto raw = Tokenizer::load(empty);
  std::filesystem::remove_all(empty);
  EXPECT_EQ(raw->encode("e\u0301", false), join({bytes("e"), {0xCC, 0x81}}));
}

}  // namespace
}  // namespace megadecode
