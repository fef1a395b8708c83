// OutputProcessor: stop strings (split across tokens, several candidates, include in output,
// multi-byte text), end tokens with min_tokens, max_tokens, a token that ends the sequence (a
// finished token constraint); released text never holds a stop
// string and the concatenation equals the expected cut text.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "engine/output_processor.h"
#include "fakes.h"

namespace megadecode {
namespace {

struct Outcome {
  std::string text;
  std::vector<std::string> pieces;
  OutputProcessor::Step last;
  int n_pushed = 0;
};

Outcome run(const StopConditions& stop, const std::vector<int32_t>& tokens) {
  OutputProcessor p(stop, std::make_unique<testing::FakeDecoder>(stop.skip_special_tokens));
  Outcome r;
  for (int32_t t : tokens) {
    r.last = p.push(t);
    ++r.n_pushed;
    r.pieces.push_back(r.last.text);
    r.text += r.last.text;
    if (r.last.finished) break;
  }
  return r;
}

std::vector<int32_t> bytes(const std::string& s) {
  std::vector<int32_t> t;
  for (unsigned char c : s) t.push_back(c);
  return t;
}

TEST(OutputProcessor, StopStringSplitAcrossTokensIsCutAndNeverReleased) {
  StopConditions stop;
  stop.max_tokens = 100;
  stop.stop = {"STOP"};
  Outcome r = run(stop, bytes("hello STOP world"));
  EXPECT_EQ(r.text, "hello ");
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.last.reason, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_string, std::optional<std::string>("STOP"));
  EXPECT_EQ(r.n_pushed, 10);  // finished on the 'P'
  for (const std::string& piece : r.pieces) EXPECT_EQ(piece.find('S'), std::string::npos);
}

TEST(OutputProcessor, EarliestOfSeveralStopStringsWins) {
  StopConditions stop;
  stop.max_tokens = 100;
  stop.stop = {"world", "o w"};
  Outcome r = run(stop, bytes("hello world"));
  EXPECT_EQ(r.text, "hell");
  EXPECT_EQ(r.last.stop_string, std::optional<std::string>("o w"));
}

TEST(OutputProcessor, IncludeStopStringInOutput) {
  StopConditions stop;
  stop.max_tokens = 100;
  stop.stop = {"\n\n"};
  stop.include_stop_str_in_output = true;
  Outcome r = run(stop, bytes("a\nb\n\nc"));
  EXPECT_EQ(r.text, "a\nb\n\n");
}

TEST(OutputProcessor, MaxTokensFlushesHeldBackText) {
  StopConditions stop;
  stop.max_tokens = 5;
  stop.stop = {"xyzzy"};
  Outcome r = run(stop, bytes("abcdefgh"));
  EXPECT_EQ(r.text, "abcde");
  EXPECT_EQ(r.last.reason, FinishReason::kLength);
  EXPECT_EQ(r.pieces[0], "");  // the last 4 bytes are always held back (a 5-byte stop string)
  EXPECT_EQ(r.pieces[3], "");
}

TEST(OutputProcessor, StopStringInsideMultiByteText) {
  StopConditions stop;
  stop.max_tokens = 100;
  stop.stop = {"é!"};
  Outcome r = run(stop, bytes("añoé!x"));
  EXPECT_EQ(r.text, "año");
  for (const std::string& piece : r.pieces) {
    if (piece.empty()) continue;
    EXPECT_NE(static_cast<unsigned char>(piece[0]) & 0xC0, 0x80) << "piece starts mid-character";
  }
}

TEST(OutputProcessor, EndTokensStopAndAreNotOutput) {
  StopConditions stop;
  stop.max_tokens = 100;
  stop.eos_token_ids = {testing::kFakeEos};
  stop.stop_token_ids = {'#'};
  Outcome a = run(stop, {'a', 'b', testing::kFakeEos, 'c'});
  EXPECT_EQ(a.text, "ab");
  EXPECT_EQ(a.last.reason, FinishReason::kStop);
  EXPECT_FALSE(a.last.stop_token.has_value());
  Outcome b = run(stop, {'a', '#', 'c'});
  EXPECT_EQ(b.text, "a");
  EXPECT_EQ(b.last.stop_token, std::optional<int32_t>('#'));
  stop.ignore_eos = true;
  Outcome c = run(stop, {'a', testing::kFakeEos, 'c', '#'});
  EXPECT_EQ(c.text, "ac");
  stop.min_tokens = 3;
  Outcome d = run(stop, {'#', 'a', '#', '#'});  // the 4th token is the first that may end it
  EXPECT_EQ(d.n_pushed, 4);
  EXPECT_EQ(d.text, "#a#");
}

// Random texts and stop sets: the released text equals the reference cut (first occurrence of
// any stop string in the full text, which must start before the token budget runs out).
// push(token, ends): a finished constraint ends the sequence with "stop" and every held-back byte
// released, ahead of max_tokens and whatever min_tokens says; an end token it allowed ends it too.
TEST(OutputProcessor, ATokenThatEndsTheSequenceStopsWithTheTextSoFar) {
  StopConditions stop;
  stop.max_tokens = 3;
  stop.min_tokens = 5;
  stop.stop = {"xyz"};  // holds back two bytes
  stop.eos_token_ids = {testing::kFakeEos};
  OutputProcessor p(stop, std::make_unique<testing::FakeDecoder>(true));
  std::string text = p.push('a').text;
  text += p.push('b').text;
  EXPECT_EQ(text, "");  // the last max_stop_bytes - 1 = 2 bytes are held back
  const OutputProcessor::Step last = p.push('c', true);  // the 3rd token: max_tokens too
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.reason, FinishReason::kStop);
  EXPECT_FALSE(last.stop_token.has_value());
  EXPECT_EQ(text + last.text, "abc");

  OutputProcessor q(stop, std::make_unique<testing::FakeDecoder>(true));
  EXPECT_FALSE(q.push('a').finished);
  EXPECT_FALSE(q.push(testing::kFakeEos).finished) << "an end token before min_tokens";
  const OutputProcessor::Step end = q.push(testing::kFakeEos, true);
  EXPECT_TRUE(end.finished);
  EXPECT_EQ(end.reason, FinishReason::kStop);
}

TEST(OutputProcessor, RandomStopStringsMatchReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng.below(40));
    for (int i = 0; i < n; ++i) text.push_back("abc "[rng.below(4)]);
    StopConditions stop;
    stop.max_tokens = 1 + static_cast<int>(rng.below(n));  // every run ends by a finish
    const int n_stop = static_cast<int>(rng.below(3));
    for (int i = 0; i < n_stop; ++i) {
      std::string s;
      const int len = 1 + static_cast<int>(rng.below(4));
      for (int k = 0; k < len; ++k) s.push_back("abc "[rng.below(4)]);
      stop.stop.push_back(s);
    }
    Outcome r = run(stop, bytes(text));
    // Reference (vLLM): after each token, the earliest match in the text so far ends it.
    const std::string gen = text.substr(0, std::min<size_t>(text.size(), stop.max_tokens));
    std::string want = gen;
    for (size_t k = 1; k <= gen.size(); ++k) {
      size_t best = std::string::npos;
      for (const std::string& s : stop.stop) best = std::min(best, gen.substr(0, k).find(s));
      if (best != std::string::npos) {
        want = gen.substr(0, best);
        break;
      }
    }
    ASSERT_EQ(r.text, want) << "text '" << text << "' max_tokens " << stop.max_tokens << " stops "
                           << ::testing::PrintToString(stop.stop);
    for (const std::string& s : stop.stop) ASSERT_EQ(r.text.find(s), std::string::npos);
  }
}

}  // namespace
}  // namespace megadecode
