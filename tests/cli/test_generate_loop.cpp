// Tests of the generate loop on cpu-ref: greedy generation equals the argmax of a full
// recomputation at every step; eos stops (unless ignored); seeded sampling repeats; bad requests
// are errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "../ref/ref_test_util.h"
#include "cli/backend_factory.h"
#include "cli/generate_loop.h"
#include "core/check.h"
#include "ref/kv_store.h"
#include "ref/ref_model.h"

namespace megadecode {
namespace {

// cpu-ref options: KV blocks of `block_size` tokens, `n_blocks` of them, `threads` workers.
BackendOptions cpu_ref(int block_size, int n_blocks, int threads) {
  return {.backend = "cpu-ref", .kv_block_size = block_size, .n_kv_blocks = n_blocks, .n_threads = threads};
}

TEST(GenerateLoop, GreedyEqualsArgmaxOfFullRecomputation) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = test::small_moe_config();
  test::TestWeights w = test::random_weights(c, Dtype::kBF16, rng.next());
  auto backend = make_backend(c, w.weights, w.store, cpu_ref(3, 10, 2));
  GenerateRequest req;
  req.prompt = test::random_tokens(rng, 5, c.vocab_size);
  req.sampling.temperature = 0.0f;
  req.max_tokens = 12;
  req.ignore_eos = true;
  std::vector<int32_t> streamed;
  const GenerateResult r = generate(*backend, req, [&](int32_t t) { streamed.push_back(t); });
  EXPECT_EQ(r.finish_reason, "length");
  ASSERT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(streamed, r.tokens);

  std::vector<int32_t> all = req.prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end() - 1);
  ref::RefModel model(c, w.weights, nullptr);
  ref::KvStore kv(c, 32, 1);
  std::vector<float> logits(all.size() * c.vocab_size);
  model.forward(SeqChunk{0, all, 0, std::vector<int32_t>{0}}, kv, logits);
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const float* row = logits.data() + (req.prompt.size() - 1 + i) * c.vocab_size;
    EXPECT_EQ(r.tokens[i], std::max_element(row, row + c.vocab_size) - row) << "generated token " << i;
  }

  // eos: stop at the first generated token when it is an eos id, unless ignored.
  req.eos_token_ids = {r.tokens[0]};
  req.ignore_eos = false;
  const GenerateResult stopped = generate(*backend, req, {});
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>{r.tokens[0]});
}

TEST(GenerateLoop, SeededSamplingRepeats) {
  const ModelConfig c = test::small_moe_config();
  test::TestWeights w = test::random_weights(c, Dtype::kBF16, 9);
  auto backend = make_backend(c, w.weights, w.store, cpu_ref(4, 8, 1));
  GenerateRequest req;
  req.prompt = {1, 2, 3};
  req.sampling = SamplingParams{1.0f, 50, 0.95f, 0.0f, 1234};
  req.max_tokens = 10;
  req.ignore_eos = true;
  const GenerateResult a = generate(*backend, req, {});
  const GenerateResult b = generate(*backend, req, {});
  EXPECT_EQ(a.tokens, b.tokens);
  req.sampling.seed = 4321;
  EXPECT_NE(generate(*backend, req, {}).tokens, a.tokens);
}

TEST(GenerateLoop, BadRequestsAreErrors) {
  const ModelConfig c = test::small_moe_config();
  test::TestWeights w = test::random_weights(c, Dtype::kBF16, 9);
  auto backend = make_backend(c, w.weights, w.store, cpu_ref(4, 2, 1));
  GenerateRequest req;
  EXPECT_THROW(generate(*backend, req, {}), Error);  // empty prompt
  req.prompt = {1, 2, 3};
  req.max_tokens = 0;
  EXPECT_THROW(generate(*backend, req, {}), Error);
  req.max_tokens = 7;  // 3 + 7 - 1 = 9 positions > 2 blocks of 4
  EXPECT_THROW(generate(*backend, req, {}), Error);
  req.max_tokens = 6;
  EXPECT_NO_THROW(generate(*backend, req, {}));
  req.prompt = {1, 500};
  EXPECT_THROW(generate(*backend, req, {}), Error);
}

}  // namespace
}  // namespace megadecode
