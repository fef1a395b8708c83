// Tests of the cpu-ref backend through the Backend interface: the factory, decode sampling
// (greedy equals the argmax of the returned logits; seeded tokens independent of the batch),
// penalties seeing the prompt/output split, and clear errors for bad calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cli/backend_factory.h"
#include "core/check.h"
#include "ref/ref_backend.h"
#include "ref_test_util.h"
#include "sampling/host_sampler.h"

namespace megadecode {
namespace {

uint64_t print_seed() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

struct Fixture {
  ModelConfig config = test::small_moe_config();
  test::TestWeights weights;
  std::unique_ptr<Backend> backend;
  explicit Fixture(uint64_t seed, int block_size = 4, int n_blocks = 40) {
    weights = test::random_weights(config, Dtype::kBF16, seed);
    const BackendOptions o{.backend = "cpu-ref", .kv_block_size = block_size, .n_kv_blocks = n_blocks, .n_threads = 2};
    backend = make_backend(config, weights.weights, weights.store, o);
  }
};

TEST(RefBackend, FactoryMakesCpuRefAndRejectsUnknownNames) {
  Fixture f(1);
  EXPECT_EQ(f.backend->name(), "cpu-ref");
  EXPECT_EQ(f.backend->kv_block_size(), 4);
  EXPECT_EQ(f.backend->n_kv_blocks(), 40);
  EXPECT_EQ(f.backend->config().hidden_size, f.config.hidden_size);
  try {
    make_backend(f.config, f.weights.weights, f.weights.store,
                 BackendOptions{.backend = "gpu-magic", .n_kv_blocks = 8});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu-ref"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_backend(f.config, f.weights.weights, f.weights.store, BackendOptions{.n_kv_blocks = 0}), Error);
}

// Runs one decode step of `seqs` (each prefilled to its length beforehand) and returns the result.
struct Seq {
  std::vector<int32_t> tokens;  // prompt + the token to decode
  std::vector<int32_t> table;
  SamplingParams sampling;
};

DecodeResult decode_step(Backend& backend, const std::vector<Seq>& seqs) {
  std::vector<DecodeSeq> batch;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int pos = static_cast<int>(seqs[s].tokens.size()) - 1;
    DecodeSeq d;
    d.chunk = SeqChunk{static_cast<int64_t>(s), std::span(seqs[s].tokens).subspan(pos, 1), pos, seqs[s].table};
    d.sampling = seqs[s].sampling;
    d.history = seqs[s].tokens;
    d.history_prompt_len = seqs[s].tokens.size();
    batch.push_back(d);
  }
  DecodeResult r;
  backend.decode(batch, true, r);
  return r;
}

TEST(RefBackend, DecodeSamplesFromItsLogitsAndIsBatchInvariant) {
  const uint64_t seed = print_seed();
  SplitMix64 rng(seed);
  Fixture f(rng.next());
  const size_t vocab = f.config.vocab_size;
  std::vector<Seq> seqs(3);
  for (size_t s = 0; s < seqs.size(); ++s) {
    seqs[s].tokens = test::random_tokens(rng, 2 + static_cast<int>(rng.below(9)), f.config.vocab_size);
    for (int b = 0; b < 3; ++b) seqs[s].table.push_back(static_cast<int32_t>(s * 10 + (2 - b)));
    const int n_prompt = static_cast<int>(seqs[s].tokens.size()) - 1;
    f.backend->prefill(SeqChunk{static_cast<int64_t>(s), std::span(seqs[s].tokens).first(n_prompt), 0, seqs[s].table},
                       {});
  }
  seqs[0].sampling.temperature = 0.0f;
  seqs[1].sampling = SamplingParams{0.9f, 20, 0.95f, 0.0f, rng.next()};
  seqs[2].sampling = SamplingParams{1.2f, 0, 1.0f, 0.01f, rng.next()};
  const DecodeResult together = decode_step(*f.backend, seqs);
  ASSERT_EQ(together.tokens.size(), 3u);
  ASSERT_EQ(together.logits.size(), 3 * vocab);
  const std::span<const float> logits0(together.logits.data(), vocab);
  EXPECT_EQ(together.tokens[0], std::max_element(logits0.begin(), logits0.end()) - logits0.begin());
  for (size_t s = 0; s < seqs.size(); ++s) {
    // Alone (re-running the same position rewrites the same K/V): same logits, same token.
    const DecodeResult alone = decode_step(*f.backend, {seqs[s]});
    EXPECT_EQ(alone.tokens[0], together.tokens[s]) << "sequence " << s;
    EXPECT_EQ(0, std::memcmp(alone.logits.data(), together.logits.data() + s * vocab, vocab * sizeof(float)));
    // The token is the host sampler's choice for the next position.
    const std::span<const float> ls(together.logits.data() + s * vocab, vocab);
    EXPECT_EQ(together.tokens[s],
              sampling::sample_token(ls, seqs[s].sampling, static_cast<int64_t>(seqs[s].tokens.size()),
                                sampling::TokenHistory{seqs[s].tokens, {}}));
  }
  DecodeResult no_logits;
  std::vector<DecodeSeq> one(1);
  one[0].chunk = SeqChunk{0, std::span(seqs[0].tokens).last(1), static_cast<int>(seqs[0].tokens.size()) - 1,
                          seqs[0].table};
  one[0].sampling.temperature = 0.0f;
  f.backend->decode(one, false, no_logits);
  EXPECT_TRUE(no_logits.logits.empty());
  EXPECT_EQ(no_logits.tokens[0], together.tokens[0]);
}

TEST(RefBackend, PenaltiesSeeTheOutputPartOfTheHistory) {
  Fixture f(print_seed());
  const std::vector<int32_t> prompt = {5, 6, 7}, table = {3, 1};
  std::vector<float> logits(f.config.vocab_size);
  f.backend->prefill(SeqChunk{0, prompt, 0, table}, logits);
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // History: the prompt, then `best` generated m times; a frequency penalty of 2 * m beyond the
  // margin changes the greedy choice only when those m tokens count as output.
  std::vector<float> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  const int m = static_cast<int>((sorted[0] - sorted[1]) / 2.0f) + 1;
  std::vector<int32_t> history = prompt;
  history.insert(history.end(), m, best);
  DecodeSeq d;
  const std::vector<int32_t> last = {prompt.back()};
  d.chunk = SeqChunk{0, last, 2, table};  // re-run position 2: same logits as the prefill's last
  d.sampling.temperature = 0.0f;
  d.sampling.frequency_penalty = 2.0f;
  d.history = history;
  DecodeResult r;
  d.history_prompt_len = history.size();  // all prompt: the frequency penalty does not apply
  f.backend->decode(std::span(&d, 1), false, r);
  EXPECT_EQ(r.tokens[0], best);
  d.history_prompt_len = prompt.size();  // `best` is output: penalised
  f.backend->decode(std::span(&d, 1), false, r);
  EXPECT_NE(r.tokens[0], best);
}

TEST(RefBackend, BadCallsAreErrors) {
  Fixture f(3);
  const std::vector<int32_t> two = {1, 2}, table = {0};
  std::vector<float> small(3);
  EXPECT_THROW(f.backend->prefill(SeqChunk{0, two, 0, table}, small), Error);
  DecodeSeq d;
  d.chunk = SeqChunk{0, two, 0, table};
  DecodeResult r;
  EXPECT_THROW(f.backend->decode(std::span(&d, 1), false, r), Error);
  d.chunk.tokens = std::span(two).first(1);
  d.history_prompt_len = 5;
  EXPECT_THROW(f.backend->decode(std::span(&d, 1), false, r), Error);
  d.history_prompt_len = 0;
  d.sampling.top_p = 2.0f;
  EXPECT_THROW(f.backend->decode(std::span(&d, 1), false, r), Error);
}

}  // namespace
}  // namespace megadecode
