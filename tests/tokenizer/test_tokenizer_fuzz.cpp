// sanitize: address
// Fuzz test of the tokenizer (also built with ASan+UBSan): random byte strings and mutated valid
// strings through encode, decode and the streaming detokenizer. Invalid UTF-8 must be an Error
// (never a crash); valid text must round-trip; random ids must decode or be an Error.
#include <chrono>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "bench/sample_text.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

using testing::escaped;
using testing::qwen3;

std::string random_bytes(SplitMix64& rng) {
  std::string s;
  const size_t len = rng.below(rng.below(10) == 0 ? 300 : 40);
  for (size_t i = 0; i < len; ++i) {
    const uint64_t r = rng.below(100);
    uint64_t b;
    if (r < 40) b = 0x20 + rng.below(0x5F);       // printable ASCII
    else if (r < 45) b = rng.below(0x20);         // controls, \n, \t, NUL
    else if (r < 70) b = 0x80 + rng.below(0x40);  // continuation bytes
    else b = 0xC0 + rng.below(0x40);              // lead bytes, valid or not
    s += static_cast<char>(b);
  }
  return s;
}

std::string mutate(std::string s, SplitMix64& rng) {
  static const char* const kInserts[] = {"<|im_start|>", "<think>", "<|im_end", "\xE4\xB8", "\u0301", "'s", "\r\n"};
  for (int k = 0, n = 1 + static_cast<int>(rng.below(4)); k < n; ++k) {
    const size_t at = s.empty() ? 0 : rng.below(s.size() + 1);
    switch (rng.below(5)) {
      case 0:
        if (at < s.size()) s[at] = static_cast<char>(s[at] ^ (1 << rng.below(8)));
        break;
      case 1:
        s.insert(at, 1, static_cast<char>(rng.below(256)));
        break;
      case 2:
        if (at < s.size()) s.erase(at, 1 + rng.below(4));
        break;
      case 3:
        s.resize(at);  // cut, possibly inside a character
        break;
      default:
        s.insert(at, kInserts[rng.below(std::size(kInserts))]);
    }
  }
  return s;
}

// One input through encode (Error iff invalid UTF-8), the round trip, and the detokenizer.
void check_text(const Tokenizer& tok, const std::string& s, SplitMix64& rng, int* n_errors) {
  const bool valid = utf8::find_invalid(s) == std::string_view::npos;
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(s, true);
  } catch (const Error&) {
    ASSERT_FALSE(valid) << "valid text rejected: \"" << escaped(s) << "\"";
    ++*n_errors;
    return;
  }
  ASSERT_TRUE(valid) << "invalid UTF-8 accepted: \"" << escaped(s) << "\"";
  const std::string back = tok.decode(ids, false);
  ASSERT_EQ(utf8::find_invalid(back), std::string_view::npos);
  // decode(encode(s)) is s with NFC applied between added tokens, which encodes to the same ids.
  ASSERT_EQ(tok.encode(back, true), ids) << "\"" << escaped(s) << "\"";
  if (rng.below(4) == 0) {
    const bool skip = rng.below(2) == 1;
    StreamingDetokenizer detok(tok, skip);
    std::string streamed;
    for (const int32_t id : ids) streamed += detok.push(id);
    streamed += detok.flush();
    ASSERT_EQ(streamed, tok.decode(ids, skip));
  }
}

TEST(TokenizerFuzz, RandomBytesAndMutations) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const Tokenizer& tok = qwen3();
  const auto start = std::chrono::steady_clock::now();
  int n_errors = 0, n_inputs = 0;
  for (int i = 0; i < 150000; ++i, ++n_inputs) {
    const std::string raw = random_bytes(rng);
    ASSERT_NO_FATAL_FAILURE(check_text(tok, raw, rng, &n_errors));
    if (i % 4 == 0) {  // the same bytes made valid (U+FFFD for each bad subpart) must encode
      std::string fixed;
      utf8::append_lossy(fixed, raw);
      ASSERT_NO_FATAL_FAILURE(check_text(tok, fixed, rng, &n_errors));
      ++n_inputs;
    }
  }
  for (int i = 0; i < 60000; ++i, ++n_inputs) {
    const auto kind = static_cast<sample_text::Kind>(rng.below(sample_text::kNumKinds));
    std::string text = sample_text::generate(kind, rng);
    if (text.size() > 2000) text.resize(2000);
    ASSERT_NO_FATAL_FAILURE(check_text(tok, mutate(text, rng), rng, &n_errors));
  }
  std::printf("%d inputs, %d rejected as invalid UTF-8, %.1f s\n", n_inputs, n_errors,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_GT(n_errors, 0);
  EXPECT_LT(n_errors, n_inputs);
}

TEST(TokenizerFuzz, RandomIds) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const Tokenizer& tok = qwen3();
  int n_errors = 0;
  for (int i = 0; i < 30000; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0, n = static_cast<int>(rng.below(24)); k < n; ++k) {
      const uint64_t r = rng.below(100);
      if (r < 2) ids.push_back(static_cast<int32_t>(rng.next()));  // anything, mostly out of range
      else if (r < 40) ids.push_back(static_cast<int32_t>(rng.below(256)));
      else ids.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(tok.vocab_size()))));
    }
    const bool skip = rng.below(2) == 1;
    std::string decoded;
    try {
      decoded = tok.decode(ids, skip);
    } catch (const Error&) {
      ++n_errors;
      StreamingDetokenizer detok(tok, skip);
      EXPECT_THROW(for (const int32_t id : ids) detok.push(id), Error);
      continue;
    }
    ASSERT_EQ(utf8::find_invalid(decoded), std::string_view::npos);
    StreamingDetokenizer detok(tok, skip);
    std::string streamed;
    for (const int32_t id : ids) streamed += detok.push(id);
    streamed += detok.flush();
    ASSERT_EQ(streamed, decoded);
  }
  EXPECT_GT(n_errors, 0);
}

}  // namespace
}  // namespace megadecode
