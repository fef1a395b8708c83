// sanitize: thread
// Property tests of the cpu-mk emulator over random shapes, batches (1..64, ragged contexts up to
// 4096, shuffled block tables), policies, SM counts and delay seeds:
//   (a) a multi-threaded run with random delays gives logits, tokens and KV cache bitwise equal to
//       the sequential run of the same plan (any missing dependency shows up here, or in TSan);
//   (b) every tile but attention computes bitwise what the reference does: at context 1 (attention
//       over one key is its value, in both) the logits and every layer's K/V are bitwise cpu-ref's,
//       also with MoE shares that straddle experts or hold nothing;
//   (c) at longer contexts only the attention's arithmetic differs (splits merged by log-sum-exp):
//       logits within kLogitRtol · max |ref|, layer 0's K/V bitwise, later layers' within kKvAtol.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "../plan/plan_test_util.h"
#include "../ref/ref_test_util.h"
#include "core/check.h"
#include "emu/emulator.h"
#include "plan/moe_split.h"
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

// The attention arithmetic's rounding carried through the later layers (measured over 1,600 random
// cases: at most 8.4e-7 of the largest logit, and 1.9e-6 on the K/V of later layers).
constexpr float kLogitRtol = 1e-5f;
constexpr float kKvAtol = 1e-5f;

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

// Bitwise, NaN payloads included; -1 when equal, else the first layer that differs.
int kv_first_difference(const KvStore& a, const KvStore& b, int n_layers) {
  for (int l = 0; l < n_layers; ++l)
    for (int blk = 0; blk < a.n_blocks(); ++blk)
      for (int s = 0; s < a.block_size(); ++s) {
        const size_t n = static_cast<size_t>(a.token_floats()) * 4;
        if (std::memcmp(a.key(l, {blk, s}), b.key(l, {blk, s}), n) != 0) return l;
        if (std::memcmp(a.value(l, {blk, s}), b.value(l, {blk, s}), n) != 0) return l;
      }
  return -1;
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

// max_ctx 0: a random one (up to 4096 for small batches); else every context in [1, max_ctx].
Case random_case(SplitMix64& rng, int max_ctx = 0) {
  Case c;
  c.config = test::random_config(rng);
  c.weights = test::random_weights(c.config, Dtype::kBF16, rng.next());
  const auto names = policy_names();
  c.policy = test::random_policy(rng, names[rng.below(names.size())]);
  const int size = static_cast<int>(rng.below(10));
  const int batch = size < 6 ? 1 + static_cast<int>(rng.below(4)) : size < 9 ? 1 + static_cast<int>(rng.below(17)) : 1 + static_cast<int>(rng.below(64));
  if (max_ctx == 0) max_ctx = batch <= 4 && rng.below(4) == 0 ? 4096 : batch <= 17 ? 300 : 100;
  c.batch = test::random_batch(rng, batch, max_ctx, test::pick(rng, {1, 4, 16}));
  c.options.n_sms = rng.below(8) == 0 ? test::pick(rng, {32, 132}) : test::pick(rng, {1, 2, 3, 5, 8, 13});
  c.tokens = test::random_tokens(rng, batch, c.config.vocab_size);
  for (int i = 0; i < batch; ++i) c.sampling.push_back(random_sampling(rng));
  return c;
}

std::string describe(const Case& c) {
  return cat("policy ", c.policy.name, " (", c.policy.tiles_per_sm, " tiles/SM), batch ", c.tokens.size(), ", sms ",
             c.options.n_sms, ", hidden ", c.config.hidden_size, ", experts ", c.config.n_experts, " top ",
             c.config.n_experts_per_tok, ", moe inter ", c.config.moe_intermediate_size, ", kv heads ",
             c.config.n_kv_heads, "x", c.config.group_size());
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

// The reference's logits of every sequence, one at a time on `kv` (which it updates).
std::vector<float> reference_logits(const Case& c, KvStore& kv, RoutingLog* routing = nullptr) {
  ref::RefModel model(c.config, c.weights.weights, nullptr);
  model.set_routing_record(routing);
  const int V = c.config.vocab_size;
  std::vector<float> out(c.tokens.size() * V);
  for (size_t s = 0; s < c.tokens.size(); ++s) {
    const SeqState& q = c.batch.state.seqs[s];
    model.forward(SeqChunk{static_cast<int64_t>(s), std::span<const int32_t>(&c.tokens[s], 1), q.n_ctx - 1, q.block_table},
                  kv, std::span<float>(out.data() + s * V, V));
  }
  return out;
}

TEST(Emulator, ThreadedEqualsSequentialAndMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const int iterations = 200 / kIterationDivisor;
  float worst_rel = 0, worst_kv = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    Case c = random_case(rng);
    const int B = static_cast<int>(c.tokens.size()), V = c.config.vocab_size, n_layers = c.config.n_layers;
    SCOPED_TRACE(cat("seed ", seed, " iter ", iter, ": ", describe(c)));
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
    ASSERT_EQ(kv_first_difference(kv_threaded, kv_sequential, n_layers), -1) << "KV caches differ";

    // (c) the reference, one sequence at a time on its own copy of the cache.
    const std::vector<float> want = reference_logits(c, kv_ref);
    for (int s = 0; s < B; ++s) {
      float max_ref = 0, max_err = 0;
      for (int i = 0; i < V; ++i) {
        const float got = a.logits[static_cast<size_t>(s) * V + i], w = want[static_cast<size_t>(s) * V + i];
        ASSERT_FALSE(std::isnan(got)) << "seq " << s << " logit " << i << " is NaN";
        max_ref = std::max(max_ref, std::fabs(w));
        max_err = std::max(max_err, std::fabs(got - w));
      }
      ASSERT_LE(max_err, kLogitRtol * max_ref) << "seq " << s << " (context " << c.batch.state.seqs[s].n_ctx << ")";
      worst_rel = std::max(worst_rel, max_err / max_ref);
    }
    EXPECT_EQ(kv_max_diff(kv_threaded, kv_ref, 0), 0.0f) << "layer 0 K/V differ from the reference";
    for (int l = 1; l < n_layers; ++l) {
      const float d = kv_max_diff(kv_threaded, kv_ref, l);
      EXPECT_LE(d, kKvAtol) << "layer " << l;
      worst_kv = std::max(worst_kv, d);
    }
  }
  std::printf("worst logit error %.3g of max |ref|, worst K/V error %.3g\n", worst_rel, worst_kv);
}

// (b): every sequence at its first token. Attention over one key is that key's value in the
// reference (softmax of one score is 1) and in the emulator (exp(0) / 1, one split), so every
// output is bitwise the reference's: the GEMM tiles with their norm prologues, the routing every
// share derives, the shares' partial sums.
TEST(Emulator, ContextOneIsBitwiseTheReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int iter = 0; iter < 100 / kIterationDivisor; ++iter) {
    Case c = random_case(rng, 1);
    SCOPED_TRACE(cat("seed ", seed, " iter ", iter, ": ", describe(c)));
    const Plan plan = make_plan(c.config, c.batch.state, c.policy, c.options);
    KvStore kv(c.config, c.batch.state.kv_block_size, c.batch.n_blocks), kv_ref(c.config, c.batch.state.kv_block_size, c.batch.n_blocks);
    kv.fill(std::numeric_limits<float>::quiet_NaN());
    kv_ref.fill(std::numeric_limits<float>::quiet_NaN());
    emu::EmulatorOptions o;
    o.delay_seed = rng.next();
    o.delay_probability = 0.1;
    emu::StepOutput out;
    emu::Emulator(c.config, c.weights.weights, kv).run(plan, step_input(c), o, out);
    const std::vector<float> want = reference_logits(c, kv_ref);
    ASSERT_EQ(out.logits.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::memcmp(&out.logits[i], &want[i], 4), 0)
          << "logit " << i % c.config.vocab_size << " of seq " << i / c.config.vocab_size << ": " << out.logits[i]
          << " vs the reference's " << want[i];
    ASSERT_EQ(kv_first_difference(kv, kv_ref, c.config.n_layers), -1) << "K/V differ from the reference";
  }
}

// How a layer's up units fall on the shares (plan/moe_split.h), from the reference's routing.
struct ShareShape {
  int straddling = 0;  // up shares with units of two or more experts
  int empty_up = 0, empty_down = 0;
};

ShareShape share_shape(const PlanShape& s, const RoutingLog& routing) {
  ShareShape out;
  for (int L = 0; L < s.n_layers; ++L) {
    std::set<int32_t> active;
    for (const auto& [key, t] : routing.tokens())
      for (int k = 0; k < s.top_k; ++k) active.insert(t.experts[L * s.top_k + k]);
    const int32_t units = static_cast<int32_t>(active.size()) * s.up_units;
    for (int sh = 0; sh < s.n_sms; ++sh) {
      const MoeShare u = moe_share(units, sh, sh + 1, s.n_sms), d = moe_share(s.down_rbs, sh, sh + 1, s.n_sms);
      out.straddling += u.end > u.begin && u.begin / s.up_units != (u.end - 1) / s.up_units;
      out.empty_up += u.end == u.begin;
      out.empty_down += d.end == d.begin;
    }
  }
  return out;
}

// The MoE shares on shapes picked so that up shares straddle experts (and at more SMs than units or
// row blocks, some hold nothing): still bitwise the reference, whose routing the test inspects to
// be sure the case is what it says.
TEST(Emulator, MoeSharesStraddlingExpertsAreBitwiseTheReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  ShareShape seen;
  for (int n_sms : {3, 5, 7, 13, 132}) {
    Case c;
    c.config = test::small_moe_config();  // hidden 64: 4 down row blocks; MoE inter 32: 4 up units
    c.config.n_experts = 12;
    c.config.n_experts_per_tok = 3;
    c.weights = test::random_weights(c.config, Dtype::kBF16, rng.next());
    c.policy = policy_by_name("default");
    c.batch = test::random_batch(rng, 6, 1, 4);
    c.options.n_sms = n_sms;
    c.tokens = test::random_tokens(rng, 6, c.config.vocab_size);
    c.sampling.assign(6, SamplingParams{});
    SCOPED_TRACE(cat("seed ", seed, ": ", describe(c)));
    const Plan plan = make_plan(c.config, c.batch.state, c.policy, c.options);
    KvStore kv(c.config, 4, c.batch.n_blocks), kv_ref = kv;
    emu::EmulatorOptions o;
    o.delay_seed = rng.next();
    o.delay_probability = 0.2;
    emu::StepOutput out;
    emu::Emulator(c.config, c.weights.weights, kv).run(plan, step_input(c), o, out);
    RoutingLog routing(c.config.n_layers, c.config.n_experts_per_tok);
    const std::vector<float> want = reference_logits(c, kv_ref, &routing);
    ASSERT_EQ(std::memcmp(out.logits.data(), want.data(), want.size() * 4), 0) << "logits differ from the reference";
    const ShareShape here = share_shape(plan.params.shape, routing);
    seen.straddling += here.straddling;
    seen.empty_up += here.empty_up;
    seen.empty_down += here.empty_down;
  }
  EXPECT_GT(seen.straddling, 0) << "no share straddled two experts";
  EXPECT_GT(seen.empty_up, 0) << "no up share was empty";
  EXPECT_GT(seen.empty_down, 0) << "no down share was empty";
}

// The tiny preset (real vocabulary size) through every policy at a few batch shapes.
TEST(Emulator, TinyPresetMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig config = preset_config("tiny");
  const test::TestWeights weights = test::random_weights(config, Dtype::kBF16, rng.next());
  const auto names = policy_names();
  for (size_t p = 0; p < names.size(); p += kIterationDivisor > 1 ? names.size() : 1) {  // TSan: one policy
    Case c;
    c.config = config;
    c.weights = weights;
    c.policy = policy_by_name(names[p]);
    c.policy.tiles_per_sm = 2;
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
    const std::vector<float> want = reference_logits(c, kv_ref);
    const int V = config.vocab_size;
    for (size_t s = 0; s < c.tokens.size(); ++s) {
      float max_ref = 0, max_err = 0;
      for (int i = 0; i < V; ++i) {
        max_ref = std::max(max_ref, std::fabs(want[s * V + i]));
        max_err = std::max(max_err, std::fabs(out.logits[s * V + i] - want[s * V + i]));
      }
      EXPECT_LE(max_err, kLogitRtol * max_ref) << names[p] << " seq " << s << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace megadecode
