// sanitize: thread
// Thread safety of the tokenizer (also built with TSan): threads encoding and decoding at the
// same time through the shared, locked BPE cache give exactly the single-thread results, also
// while cache shards are being cleared (a BPE model with a tiny cache).
#include <thread>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "tokenizer/bpe.h"
#include "bench/sample_text.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

constexpr int kThreads = 4;

TEST(TokenizerThreads, ConcurrentEncodeMatchesSingleThread) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::vector<std::string> texts = sample_text::corpus(seed, 12);
  // Expected ids from a fresh tokenizer used by one thread.
  std::vector<std::vector<int32_t>> expected;
  {
    const auto solo = Tokenizer::load(testing::qwen3_dir());
    for (const std::string& t : texts) expected.push_back(solo->encode(t, true));
  }
  const auto shared = Tokenizer::load(testing::qwen3_dir());  // cold cache: threads fill it together
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SplitMix64 rng(seed + static_cast<uint64_t>(t));
      for (int round = 0; round < 2; ++round) {
        for (size_t k = 0; k < texts.size(); ++k) {
          const size_t i = (k * 7919 + static_cast<size_t>(t) * 131 + rng.below(3)) % texts.size();
          const std::vector<int32_t> ids = shared->encode(texts[i], true);
          if (ids != expected[i]) ++failures[static_cast<size_t>(t)];
          if (shared->decode(ids, false).size() < texts[i].size() / 4) ++failures[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], 0) << "thread " << t;
}

TEST(TokenizerThreads, CacheEvictionUnderContention) {
  // All bytes plus merges building "ab", "abab", ...: every random word is a distinct cache key.
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"}, {"ab", "ab"}, {"b", "a"}, {"abab", "abab"}};
  for (const auto& [l, r] : merges) vocab.push_back(l + r);
  const BpeModel model(vocab, merges, /*cache_shard_capacity=*/3);
  auto words = [](uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<std::string> out;
    for (int i = 0; i < 400; ++i) {
      std::string w;
      for (size_t k = 0, n = 1 + rng.below(20); k < n; ++k) w += "ab"[rng.below(2)];
      out.push_back(w);
    }
    return out;
  };
  const BpeModel reference(vocab, merges, 1 << 20);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (const std::string& w : words(static_cast<uint64_t>(t % 2))) {
        std::vector<int32_t> got, want;
        model.encode_piece(w, got);
        reference.encode_piece(w, want);
        if (got != want) ++failures[static_cast<size_t>(t)];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], 0) << "thread " << t;
}

}  // namespace
}  // namespace megadecode
