// sanitize: thread
// Property tests of the cpu-mk emulator over random shapes, batches (1..64, ragged contexts up to
// 4096, shuffled block tables), policies, SM counts and delay seeds:
//   (a) a multi-threaded run with random delays gives logits, tokens and KV cache bitwise equal to
//       the sequential run of the same plan (any missing dependency shows up here, or in TSan);
//   (b) the logits match the reference model within 1e-4 · max |ref|, and the KV the step writes
//       matches the reference's (bitwise for layer 0, whose inputs are bitwise the reference's).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "../plan/plan_test_util.h"
#include "../ref/ref_test_util.h"
#include "core/check.h"
#include "emu/emulator.h"
#include "plan/planner.h"
#include "plan/validator.h"
#include "ref/ref_model.h"
#include "sampling/host_sampler.h"

namespace megadecode {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr int kIterationDivisor = 5;  // TSan runs ~10x slower: fewer configurations
#else
constexpr int kIterationDivisor = 1;
#endif

using ref::KvStore;

// Random K/V for every position before each sequence's new token; the rest stays NaN.
void fill_history(KvStore& kv, const BatchState& batch, int n_layers, SplitMix64& rng) {
  kv.fill(std::numeric_limits<float>::quiet_NaN());
  for (const SeqState& q : batch.seqs)
    for (int pos = 0; pos + 1 < q.n_ctx; ++pos) {
      const KvStore::Slot s = kv.locate(q.block_table, pos);
      for (int l = 0; l < n_layers; ++l)
        for (int i = 0; i < kv.token_floats(); ++i) {
          kv.key(l, s)[i] = rng.normal();
          kv.value(l, s)[i] = rng.normal();
        }
    }
}

// Max |a - b| over every stored float of layer `l` (NaN where both are NaN counts as equal;
// NaN on one side only as infinite).
float kv_max_diff(const KvStore& a, const KvStore& b, int l) {
  float worst = 0;
  for (int blk = 0; blk < a.n_blocks(); ++blk)
    for (int s = 0; s < a.block_size(); ++s)
      for (int kv = 0; kv < 2; ++kv) {
        const float* x = kv ? a.value(l, {blk, s}) : a.key(l, {blk, s});
        const float* y = kv ? b.value(l, {blk, s}) : b.key(l, {blk, s});
        for (int i = 0; i < a.token_floats(); ++i) {
          if (std::isnan(x[i]) && std::isnan(y[i])) continue;
          const float d = std::fabs(x[i] - y[i]);
          worst = std::max(worst, std::isnan(d) ? std::numeric_limits<float>::infinity() : d);
        }
      }
  return worst;
}

bool kv_bitwise_equal(const KvStore& a, const KvStore& b, int n_layers) {
  for (int l = 0; l < n_layers; ++l)
    for (int blk = 0; blk < a.n_blocks(); ++blk)
      for (int s = 0; s < a.block_size(); ++s) {
        const size_t n = static_cast<size_t>(a.token_floats()) * 4;
        if (std::memcmp(a.key(l, {blk, s}), b.key(l, {blk, s}), n) != 0) return false;
        if (std::memcmp(a.value(l, {blk, s}), b.value(l, {blk, s}), n) != 0) return false;
      }
  return true;
}

SamplingParams random_sampling(SplitMix64& rng) {
  SamplingParams p;
  if (rng.below(3) == 0) {
    p.temperature = 0.0f;
  } else {
    p.temperature = 0.5f + rng.unit();
    p.top_k = static_cast<int>(rng.below(20));
    p.top_p = 0.5f + 0.5f * rng.unit();
    p.seed = rng.next();
  }
  return p;
}

struct Case {
  ModelConfig config;
  test::TestWeights weights;
  test::RandomBatch batch;
  Policy policy;
  PlanOptions options;
  std::vector<int32_t> tokens;
  std::vector<SamplingParams> sampling;
};

Case random_case(SplitMix64& rng) {
  Case c;
  c.config = test::random_config(rng);
  c.weights = test::random_weights(c.config, Dtype::kBF16, rng.next());
  const auto names = policy_names();
  c.policy = test::random_policy(rng, names[rng.below(names.size())]);
  const int size = static_cast<int>(rng.below(10));
  const int batch = size < 6 ? 1 + static_cast<int>(rng.below(4)) : size < 9 ? 1 + static_cast<int>(rng.below(17)) : 1 + static_cast<int>(rng.below(64));
  const int max_ctx = batch <= 4 && rng.below(4) == 0 ? 4096 : batch <= 17 ? 300 : 100;
  c.batch = test::random_batch(rng, batch, max_ctx, test::pick(rng, {1, 4, 16}));
  c.options.n_sms = rng.below(8) == 0 ? test::pick(rng, {32, 132}) : test::pick(rng, {1, 2, 3, 5, 8, 13});
  c.tokens = test::random_tokens(rng, batch, c.config.vocab_size);
  for (int i = 0; i < batch; ++i) c.sampling.push_back(random_sampling(rng));
  return c;
}

emu::StepInput step_input(const Case& c) {
  emu::StepInput in;
  in.tokens = c.tokens;
  in.batch = &c.batch.state;
  in.sampling = c.sampling;
  in.sampler = [&c](int t, std::span<const float> logits) {
    return sampling::sample_token(logits, c.sampling[t], c.batch.state.seqs[t].n_ctx, {});
  };
  return in;
}

TEST(Emulator, ThreadedEqualsSequentialAndMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const int iterations = 200 / kIterationDivisor;
  for (int iter = 0; iter < iterations; ++iter) {
    Case c = random_case(rng);
    const int B = static_cast<int>(c.tokens.size()), V = c.config.vocab_size, n_layers = c.config.n_layers;
    SCOPED_TRACE(cat("seed ", seed, " iter ", iter, ": policy ", c.policy.name, ", batch ", B, ", sms ",
                     c.options.n_sms, ", hidden ", c.config.hidden_size, ", experts ", c.config.n_experts, " top ",
                     c.config.n_experts_per_tok, ", kv heads ", c.config.n_kv_heads, "x", c.config.group_size()));
    const Plan plan = make_plan(c.config, c.batch.state, c.policy, c.options);
    ASSERT_NO_THROW(validate_plan(plan));

    KvStore kv_threaded(c.config, c.batch.state.kv_block_size, c.batch.n_blocks);
    fill_history(kv_threaded, c.batch.state, n_layers, rng);
    KvStore kv_sequential = kv_threaded, kv_ref = kv_threaded;

    emu::EmulatorOptions threaded;
    threaded.delay_seed = rng.next();
    threaded.delay_probability = test::pick(rng, {0, 5, 20, 50}) / 100.0;
    emu::EmulatorOptions sequential;
    sequential.sequential = true;
    const emu::StepInput in = step_input(c);
    emu::StepOutput a, b;
    emu::Emulator(c.config, c.weights.weights, kv_threaded).run(plan, in, threaded, a);
    emu::Emulator(c.config, c.weights.weights, kv_sequential).run(plan, in, sequential, b);

    // (a) bitwise equal, whatever the interleaving.
    ASSERT_EQ(a.logits.size(), static_cast<size_t>(B) * V);
    ASSERT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0) << "logits differ";
    ASSERT_EQ(a.tokens, b.tokens);
    ASSERT_TRUE(kv_bitwise_equal(kv_threaded, kv_sequential, n_layers)) << "KV caches differ";

    // (b) the reference, one sequence at a time on its own copy of the cache.
    ref::RefModel model(c.config, c.weights.weights, nullptr);
    std::vector<float> want(V);
    for (int s = 0; s < B; ++s) {
      const SeqState& q = c.batch.state.seqs[s];
      model.forward(SeqChunk{s, std::span<const int32_t>(&c.tokens[s], 1), q.n_ctx - 1, q.block_table}, kv_ref, want);
      float max_ref = 0, max_err = 0;
      for (int i = 0; i < V; ++i) {
        const float got = a.logits[static_cast<size_t>(s) * V + i];
        ASSERT_FALSE(std::isnan(got)) << "seq " << s << " logit " << i << " is NaN";
        max_ref = std::max(max_ref, std::fabs(want[i]));
        max_err = std::max(max_err, std::fabs(got - want[i]));
      }
      ASSERT_LE(max_err, 1e-4f * max_ref) << "seq " << s << " (context " << q.n_ctx << ")";
    }
    EXPECT_EQ(kv_max_diff(kv_threaded, kv_ref, 0), 0.0f) << "layer 0 K/V differ from the reference";
    for (int l = 1; l < n_layers; ++l) EXPECT_LE(kv_max_diff(kv_threaded, kv_ref, l), 1e-4f) << "layer " << l;
  }
}

// The tiny preset (real vocabulary size) through every policy at a few batch shapes.
TEST(Emulator, TinyPresetMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig config = preset_config("tiny");
  const test::TestWeights weights = test::random_weights(config, Dtype::kBF16, rng.next());
  ref::RefModel model(config, weights.weights, nullptr);
  const auto names = policy_names();
  for (size_t p = 0; p < names.size(); p += kIterationDivisor > 1 ? names.size() : 1) {  // TSan: one policy
    Case c;
    c.config = config;
    c.policy = policy_by_name(names[p]);
    c.policy.tile_weight_bytes = 4096;
    c.policy.lm_tile_weight_bytes = 1 << 20;
    c.policy.attn_min_split_tokens = 32;
    c.batch = test::random_batch(rng, 1 + static_cast<int>(rng.below(5)), 200, 16);
    c.options.n_sms = 8;
    c.tokens = test::random_tokens(rng, static_cast<int>(c.batch.state.seqs.size()), config.vocab_size);
    for (size_t i = 0; i < c.tokens.size(); ++i) c.sampling.push_back(random_sampling(rng));
    const Plan plan = make_plan(config, c.batch.state, c.policy, c.options);
    validate_plan(plan);
    KvStore kv(config, 16, c.batch.n_blocks);
    fill_history(kv, c.batch.state, config.n_layers, rng);
    KvStore kv_ref = kv;
    emu::EmulatorOptions o;
    o.delay_seed = rng.next();
    o.delay_probability = 0.1;
    emu::StepOutput out;
    emu::Emulator(config, weights.weights, kv).run(plan, step_input(c), o, out);
    const int V = config.vocab_size;
    std::vector<float> want(V);
    for (size_t s = 0; s < c.tokens.size(); ++s) {
      const SeqState& q = c.batch.state.seqs[s];
      model.forward(SeqChunk{0, std::span<const int32_t>(&c.tokens[s], 1), q.n_ctx - 1, q.block_table}, kv_ref, want);
      float max_ref = 0, max_err = 0;
      for (int i = 0; i < V; ++i) {
        max_ref = std::max(max_ref, std::fabs(want[i]));
        max_err = std::max(max_err, std::fabs(out.logits[s * V + i] - want[i]));
      }
      EXPECT_LE(max_err, 1e-4f * max_ref) << names[p] << " seq " << s << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace megadecode
