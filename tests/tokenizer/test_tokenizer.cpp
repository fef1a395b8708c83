// Unit tests of the tokenizer against hand-checked values: Unicode tables, UTF-8 handling, the
// pre-tokenizer, BPE merge order (short and long pieces against a textbook implementation),
// the Qwen3 vocabulary, errors, the streaming detokenizer and the chat template.
#include <algorithm>
#include <fstream>
#include <functional>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/rng.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "bench/sample_text.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

using testing::escaped;
using testing::expect_load_error;
using testing::qwen3;

TEST(UnicodeTables, SortedAndConsistent) {
  using namespace unicode;
  auto ranges_sorted = [](const CodeRange* r, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (r[i].lo > r[i].hi || (i > 0 && r[i - 1].hi >= r[i].lo)) return false;
    }
    return true;
  };
  EXPECT_TRUE(ranges_sorted(kLetterRanges, kLetterRanges_count));
  EXPECT_TRUE(ranges_sorted(kNumberRanges, kNumberRanges_count));
  EXPECT_TRUE(ranges_sorted(kSpaceRanges, kSpaceRanges_count));
  EXPECT_TRUE(std::is_sorted(kCccRanks, kCccRanks + kCccRanks_count,
                             [](const CccEntry& a, const CccEntry& b) { return a.cp < b.cp; }));
  EXPECT_TRUE(std::is_sorted(kDecompositions, kDecompositions + kDecompositions_count,
                             [](const Decomposition& a, const Decomposition& b) { return a.cp < b.cp; }));
  EXPECT_TRUE(std::is_sorted(kQuickCheckNo, kQuickCheckNo + kQuickCheckNo_count));
  EXPECT_TRUE(std::is_sorted(kQuickCheckMaybe, kQuickCheckMaybe + kQuickCheckMaybe_count));
  // Known classes: ccc(U+0323 dot below) = 220 < ccc(U+0301 acute) = 230 < ccc(U+0345) = 240.
  EXPECT_LT(ccc_rank(0x0323), ccc_rank(0x0301));
  EXPECT_LT(ccc_rank(0x0301), ccc_rank(0x0345));
  EXPECT_EQ(ccc_rank(U'a'), 0);
  EXPECT_TRUE(ranges_sorted(kUpperRanges, kUpperRanges_count));
  EXPECT_TRUE(ranges_sorted(kLowerRanges, kLowerRanges_count));
  EXPECT_TRUE(ranges_sorted(kLetterOtherRanges, kLetterOtherRanges_count));
  EXPECT_TRUE(ranges_sorted(kMarkRanges, kMarkRanges_count));
  EXPECT_EQ(char_class(U'A'), kLetter | kUpper);
  EXPECT_EQ(char_class(U'a'), kLetter | kLower);
  EXPECT_EQ(char_class(U'\u01C5'), kLetter | kUpper);        // titlecase Dz with caron (Lt)
  EXPECT_EQ(char_class(U'\u02B0'), kLetter | kLetterOther);  // modifier letter small h (Lm)
  EXPECT_EQ(char_class(U'\u4E2D'), kLetter | kLetterOther);
  EXPECT_EQ(char_class(U'7'), kNumber);
  EXPECT_EQ(char_class(U'\u00B2'), kNumber);  // superscript two is \p{N} (No)
  EXPECT_EQ(char_class(U'\u3000'), kSpace);
  EXPECT_EQ(char_class(U'\uFEFF'), kSpace);   // JavaScript's \s includes the BOM ...
  EXPECT_EQ(char_class(U'\u0085'), kOther);   // ... and not NEL
  EXPECT_EQ(char_class(U'\u0301'), kMark);    // marks are not letters
}

TEST(Nfc, HandChecked) {
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00E9");
  EXPECT_EQ(unicode::nfc("\u212B"), "\u00C5");                   // Angstrom sign: singleton
  EXPECT_EQ(unicode::nfc("s\u0307\u0323"), "\u1E69");            // reordered, then composed twice
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11A8"), "\uAC01");       // Hangul L V T
  EXPECT_EQ(unicode::nfc("\u0958"), "\u0915\u093C");             // composition exclusion
  EXPECT_EQ(unicode::nfc("a\u0301\u0301"), "\u00E1\u0301");      // the second acute is blocked
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_FALSE(unicode::is_nfc_quick("e\u0301"));
  EXPECT_TRUE(unicode::is_nfc_quick("caf\u00E9 \u4E2D\u6587 \U0001F600"));
}

TEST(Utf8, ValidationAndLossyDecoding) {
  EXPECT_EQ(utf8::find_invalid("ok \u00E9\u4E2D\U0001F600"), std::string_view::npos);
  EXPECT_EQ(utf8::find_invalid("ab\xC0\xAF"), 2u);        // overlong
  EXPECT_EQ(utf8::find_invalid("\xED\xA0\x80"), 0u);      // surrogate
  EXPECT_EQ(utf8::find_invalid("x\xF4\x90\x80\x80"), 1u); // past U+10FFFF
  EXPECT_EQ(utf8::find_invalid("\xE4\xB8"), 0u);          // truncated
  auto lossy = [](std::string_view s) {
    std::string out;
    utf8::append_lossy(out, s);
    return out;
  };
  const std::string r = "\uFFFD";
  // One U+FFFD per maximal subpart (the WHATWG / Unicode recommended practice).
  EXPECT_EQ(lossy("\xF0\x9F\x98"), r);
  EXPECT_EQ(lossy("\xF0\x9F\x98" "a"), r + "a");
  EXPECT_EQ(lossy("\xE0\x80"), r + r);
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);
  EXPECT_EQ(lossy("\x80\xBF"), r + r);
  EXPECT_EQ(lossy("\xE4\xB8\xE4\xB8\xAD"), r + "\u4E2D");
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xE4"), 1u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("ab\xF4\x90"), 0u);  // already invalid
  EXPECT_EQ(utf8::incomplete_tail_length("\x80\x80\x80"), 0u);
}

std::vector<std::string> pieces_of(std::string_view text) {
  std::vector<std::string_view> pieces;
  pretokenize(text, pieces);
  return {pieces.begin(), pieces.end()};
}

TEST(Pretokenize, HandChecked) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces_of("Hello world's"), (V{"Hello", " world", "'s"}));
  EXPECT_EQ(pieces_of("  hi"), (V{" ", " hi"}));
  EXPECT_EQ(pieces_of("a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(pieces_of("x   \n\ty"), (V{"x", "   \n", "\ty"}));
  EXPECT_EQ(pieces_of("I'M 're 'Ll'd"), (V{"I", "'M", " '", "re", " '", "Ll", "'d"}));
  EXPECT_EQ(pieces_of("12345"), (V{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(pieces_of("foo(bar)\r\n\r\n"), (V{"foo", "(bar", ")\r\n\r\n"}));
  EXPECT_EQ(pieces_of("  ...  "), (V{" ", " ...", "  "}));
  EXPECT_EQ(pieces_of("\t\tx"), (V{"\t", "\tx"}));
  EXPECT_EQ(pieces_of("\u00E9\u0301x"), (V{"\u00E9", "\u0301x"}));
  EXPECT_EQ(pieces_of("a \u00A0b"), (V{"a", " ", "\u00A0b"}));
  EXPECT_EQ(pieces_of("x \n \n y"), (V{"x", " \n \n", " y"}));
  EXPECT_EQ(pieces_of("end   "), (V{"end", "   "}));
  EXPECT_EQ(pieces_of(""), V{});
}

// Textbook BPE: repeatedly merge the lowest-rank adjacent pair, leftmost first.
std::vector<std::string> reference_bpe(const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> parts;
  for (const char c : word) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int best_rank = -1;
    size_t best = 0;
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      auto it = ranks.find({parts[k], parts[k + 1]});
      if (it != ranks.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank < 0) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
  return parts;
}

TEST(Bpe, MatchesTextbookOnShortAndLongPieces) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  // Vocabulary: all 256 bytes plus random merges over the alphabet "abc".
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  std::vector<std::pair<std::string, std::string>> merges;
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::vector<std::string> pool = {"a", "b", "c"};
  for (int m = 0; m < 60; ++m) {
    const std::string l = pool[rng.below(pool.size())], r = pool[rng.below(pool.size())];
    if (ranks.count({l, r}) || l.size() + r.size() > 12) continue;
    ranks[{l, r}] = static_cast<int>(merges.size());
    merges.emplace_back(l, r);
    if (std::find(vocab.begin(), vocab.end(), l + r) == vocab.end()) {
      vocab.push_back(l + r);
      pool.push_back(l + r);
    }
  }
  const BpeModel model(vocab, merges);
  for (int t = 0; t < 400; ++t) {
    const size_t len = 1 + rng.below(t % 4 == 0 ? 400 : 60);  // both sides of the short/long switch
    std::string word;
    for (size_t k = 0; k < len; ++k) word += "abc"[rng.below(rng.below(2) ? 3 : 1)];
    std::vector<int32_t> ids;
    model.encode_piece(word, ids);
    model.encode_piece(word, ids);  // the second call is served by the cache
    std::vector<std::string> got;
    for (const int32_t id : ids) got.push_back(model.token_bytes(id));
    std::vector<std::string> want = reference_bpe(word, ranks);
    const std::vector<std::string> twice = [&] {
      std::vector<std::string> v = want;
      v.insert(v.end(), want.begin(), want.end());
      return v;
    }();
    ASSERT_EQ(got, twice) << "word " << word;
  }
}

TEST(Qwen3, KnownTokens) {
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_EQ(tok.encode("Hello world", true), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok.encode("", true), std::vector<int32_t>{});
  EXPECT_EQ(tok.encode("<|im_start|>user\n", false), (std::vector<int32_t>{151644, 872, 198}));
  EXPECT_EQ(tok.token_id("<|im_end|>"), std::optional<int32_t>(151645));
  EXPECT_EQ(tok.token_id("<think>"), std::optional<int32_t>(151667));
  EXPECT_EQ(tok.token_id("Hello"), std::optional<int32_t>(9707));
  EXPECT_EQ(tok.token_id("\u0120world"), std::optional<int32_t>(1879));  // "Ġworld"
  EXPECT_EQ(tok.token_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.eos_token_id(), std::optional<int32_t>(151645));
  EXPECT_TRUE(tok.is_special(151643));
  EXPECT_TRUE(tok.is_special(151645));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is an added token, not a special one
  EXPECT_TRUE(tok.is_added_token(151667));
  EXPECT_FALSE(tok.is_added_token(9707));
  EXPECT_EQ(tok.token_bytes(1879), " world");
  EXPECT_EQ(tok.token_bytes(151645), "<|im_end|>");
  const std::vector<int32_t> ids = {151644, 9707, 151645, 151667, 1879};
  EXPECT_EQ(tok.decode(ids, false), "<|im_start|>Hello<|im_end|><think> world");
  EXPECT_EQ(tok.decode(ids, true), "Hello<think> world");
}

TEST(Qwen3, BadInputIsAnError) {
  const Tokenizer& tok = qwen3();
  EXPECT_THROW(tok.encode("ok\xFFno", true), Error);
  EXPECT_THROW(tok.encode("\xE4\xB8", true), Error);
  try {
    tok.encode("abc\xC0\xAF", true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> bad = {9707, 151669};
  EXPECT_THROW(tok.decode(bad, false), Error);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(tok.decode(negative, false), Error);
  EXPECT_THROW(tok.token_bytes(1 << 30), Error);
  StreamingDetokenizer detok(tok, false);
  EXPECT_THROW(detok.push(-5), Error);
}

// A tiny tokenizer in the Qwen2 format: the 256 bytes (id = byte), merges h+e, l+l, he+ll, and
// one special token.
nlohmann::json tiny_tokenizer_json() {
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                     {"use_regex", false}};
  const std::string pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<uint8_t>(b))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  using nlohmann::json;
  const json merges = json::array({json::array({"h", "e"}), json::array({"l", "l"}), json::array({"he", "ll"})});
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 259}, {"content", "<|end|>"}, {"special", true}, {"lstrip", false},
                             {"rstrip", false}, {"single_word", false}, {"normalized", false}}}},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              byte_level}}}},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

// Writes a model directory holding the tiny tokenizer, changed by edit.
std::filesystem::path tiny_tokenizer(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("megadecode-tok-" + name + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  nlohmann::json j = tiny_tokenizer_json();
  edit(j);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|end|>"})";
  return dir;
}

TEST(TokenizerLoad, TinyTokenizer) {
  const auto dir = tiny_tokenizer("ok", [](auto&) {});
  const auto tok = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(tok->vocab_size(), 260);
  EXPECT_EQ(tok->eos_token_id(), std::optional<int32_t>(259));
  // "hello" -> he l l o -> he ll o -> hell o; " he" -> ' ' he.
  EXPECT_EQ(tok->encode("hello<|end|> he", false), (std::vector<int32_t>{258, 'o', 259, ' ', 256}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{258, 'o', 259, ' ', 256}, true), "hello he");
  EXPECT_EQ(tok->encode("e\u0301", false), (std::vector<int32_t>{0xC3, 0xA9}));  // NFC: U+00E9
}

TEST(TokenizerLoad, UnsupportedOrBrokenFilesAreErrors) {
  expect_load_error("/nonexistent/model", "tokenizer.json");
  expect_load_error(tiny_tokenizer("nfkc", [](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }), "normalizer");
  expect_load_error(tiny_tokenizer("regex", [](auto& j) {
                      j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
                    }),
                    "pre_tokenizer");
  // A pre-tokenizer the tokenizer does not implement is named in the error (more in
  // test_tokenizer_stages.cpp).
  expect_load_error(tiny_tokenizer("digits", [](auto& j) {
                      j["pre_tokenizer"] = {{"type", "Sequence"},
                                            {"pretokenizers",
                                             {{{"type", "Digits"}, {"individual_digits", true}},
                                              {{"type", "WhitespaceSplit"}},
                                              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
                    }),
                    "unsupported pre_tokenizer Sequence[Digits(individual_digits), WhitespaceSplit, ByteLevel(use_regex)]");
  expect_load_error(tiny_tokenizer("decoder", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }),
                    "unsupported decoder WordPiece");
  expect_load_error(tiny_tokenizer("fallback", [](auto& j) { j["model"]["byte_fallback"] = true; }), "byte_fallback");
  expect_load_error(tiny_tokenizer("merge", [](auto& j) { j["model"]["merges"][1] = nlohmann::json::array({"zz", "q"}); }), "merge 1");
  expect_load_error(tiny_tokenizer("gap", [](auto& j) { j["model"]["vocab"]["hell"] = 300; }), "vocab ids");
  expect_load_error(tiny_tokenizer("byte", [](auto& j) { j["model"]["vocab"].erase("a"); }), "vocab ids");
  expect_load_error(tiny_tokenizer("eos", [](auto& j) { j["added_tokens"] = nlohmann::json::array(); }), "eos_token");
  const auto broken = tiny_tokenizer("json", [](auto&) {});
  std::ofstream(broken / "tokenizer.json") << "{\"model\": ";
  expect_load_error(broken, "not valid JSON");
  // Without a normalizer, decomposed text is left alone.
  const auto dir = tiny_tokenizer("nonorm", [](auto& j) { j["normalizer"] = nullptr; });
  const auto tok = Tokenizer::load(dir);
  EXPECT_EQ(tok->encode("e\u0301", false), (std::vector<int32_t>{'e', 0xCC, 0x81}));
  std::filesystem::remove_all(dir);
}

// Checks the streaming contract on one id sequence: every chunk is valid UTF-8, the chunks
// concatenate to decode(ids), and nothing is held back once a character is complete.
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamingDetokenizer detok(tok, skip);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = detok.push(ids[i]);
    ASSERT_EQ(utf8::find_invalid(chunk), std::string_view::npos) << "chunk \"" << escaped(chunk) << "\"";
    streamed += chunk;
    // What decode gives for the prefix, minus a truncated character at its end, was emitted.
    const std::string prefix = tok.decode(std::span(ids).first(i + 1), skip);
    ASSERT_EQ(prefix.substr(0, streamed.size()), streamed);
  }
  streamed += detok.flush();
  ASSERT_EQ(streamed, tok.decode(ids, skip));
}

TEST(StreamingDetokenizer, RandomIdsSplittingCharacters) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const Tokenizer& tok = qwen3();
  // Ids whose bytes are UTF-8 fragments: single bytes >= 0x80 and tokens ending mid-character.
  std::vector<int32_t> fragments;
  for (int32_t id = 0; id < 151643 && fragments.size() < 4000; ++id) {
    const std::string b = tok.token_bytes(id);
    if (utf8::find_invalid(b) != std::string_view::npos) fragments.push_back(id);
  }
  ASSERT_GT(fragments.size(), 500u);
  for (int t = 0; t < 300; ++t) {
    std::vector<int32_t> ids;
    for (int k = 0, n = static_cast<int>(rng.below(40)); k < n; ++k) {
      const uint64_t r = rng.below(10);
      if (r < 5) ids.push_back(fragments[rng.below(fragments.size())]);
      else if (r < 8) ids.push_back(static_cast<int32_t>(rng.below(151643)));
      else ids.push_back(151643 + static_cast<int32_t>(rng.below(26)));
    }
    check_stream(tok, ids, rng.below(2) == 1);
  }
  // Encoded text: emoji and CJK split across tokens must come out whole.
  for (int t = 0; t < 100; ++t) {
    const std::string text = sample_text::generate(static_cast<sample_text::Kind>(rng.below(sample_text::kNumKinds - 2)), rng);
    const std::vector<int32_t> ids = tok.encode(text, false);
    check_stream(tok, ids, false);
    check_stream(tok, ids, true);
  }
}

// The id of the token that stands for exactly one byte.
int32_t byte_token(const Tokenizer& tok, char byte) {
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!tok.is_added_token(id) && tok.token_bytes(id) == std::string(1, byte)) return id;
  }
  return -1;
}

TEST(StreamingDetokenizer, HoldsBackPartialCharacters) {
  const Tokenizer& tok = qwen3();
  std::vector<int32_t> bytes;  // "\U0001F600" is F0 9F 98 80, one byte token each
  for (const char c : std::string("\xF0\x9F\x98\x80")) bytes.push_back(byte_token(tok, c));
  StreamingDetokenizer detok(tok, false);
  EXPECT_EQ(detok.push(bytes[0]), "");
  EXPECT_EQ(detok.push(bytes[1]), "");
  EXPECT_EQ(detok.push(bytes[2]), "");
  EXPECT_EQ(detok.push(bytes[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(detok.push(bytes[0]), "");
  EXPECT_EQ(detok.flush(), "\uFFFD");  // a truncated character at the end decodes as decode() does
  EXPECT_EQ(detok.flush(), "");
}

}  // namespace
}  // namespace megadecode
