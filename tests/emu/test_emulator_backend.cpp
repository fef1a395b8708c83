// The cpu-mk backend through the Backend interface, against cpu-ref: prefill logits, then decode
// steps over a ragged batch fed the same tokens, logits within 1e-5 · max |ref| at every step (only
// the attention arithmetic differs: a one-token prompt's logits are bitwise cpu-ref's); sampled
// tokens are the host sampler's on the returned logits; bad calls are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "../ref/ref_test_util.h"
#include "cli/backend_factory.h"
#include "cli/generate_loop.h"
#include "core/check.h"
#include "emu/emulator_backend.h"
#include "ref/ref_backend.h"
#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"

namespace megadecode {
namespace {

float max_abs(std::span<const float> x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

void expect_close(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " logit " << i;
    err = std::max(err, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(err, 1e-5f * max_abs(want)) << what;
}

TEST(CpuMkBackend, MatchesCpuRefOverPrefillAndDecodeSteps) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig config = test::small_moe_config();
  const test::TestWeights w = test::random_weights(config, Dtype::kBF16, rng.next());
  const int bs = 4, n_blocks = 64, V = config.vocab_size;
  BackendOptions mk_opt{.backend = "cpu-mk", .kv_block_size = bs, .n_kv_blocks = n_blocks};
  mk_opt.n_threads = 1 + static_cast<int>(rng.below(12));  // emulated SMs
  mk_opt.policy = policy_names()[rng.below(policy_names().size())];
  emu::EmulatorOptions delays;
  delays.delay_seed = rng.next();
  delays.delay_probability = 0.05;
  emu::CpuMkBackend mk(config, w.weights, w.store, mk_opt, delays);
  ref::RefBackend ref(config, w.weights, w.store, {.kv_block_size = bs, .n_kv_blocks = n_blocks, .n_threads = 1});
  SCOPED_TRACE(cat("seed ", seed, " sms ", mk_opt.n_threads, " policy ", mk_opt.policy));

  // Three sequences with shuffled blocks; prompts of ragged lengths, the first of one token.
  std::vector<int32_t> pool(n_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  for (int i = n_blocks - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
  struct Seq {
    std::vector<int32_t> tokens, table;
    SamplingParams sampling;
  };
  std::vector<Seq> seqs(3);
  for (int s = 0; s < 3; ++s) {
    seqs[s].table.assign(pool.begin() + s * 20, pool.begin() + (s + 1) * 20);
    seqs[s].tokens = test::random_tokens(rng, s == 0 ? 1 : 1 + static_cast<int>(rng.below(13)), V);
    if (s == 2) {
      seqs[s].sampling.temperature = 0.8f;
      seqs[s].sampling.top_p = 0.9f;
      seqs[s].sampling.seed = rng.next();
    } else {
      seqs[s].sampling.temperature = 0;
    }
    std::vector<float> a(V), b(V);
    const SeqChunk chunk{s, seqs[s].tokens, 0, seqs[s].table};
    mk.prefill(chunk, a);
    ref.prefill(chunk, b);
    expect_close(a, b, cat("prefill of sequence ", s));
    if (s == 0) {
      EXPECT_EQ(a, b) << "a one-token prompt differs from cpu-ref's";
    }
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<DecodeSeq> batch;
    std::vector<int32_t> last(3);
    for (int s = 0; s < 3; ++s) {
      last[s] = seqs[s].tokens.back();
      DecodeSeq d;
      d.chunk = SeqChunk{s, std::span<const int32_t>(&last[s], 1), static_cast<int>(seqs[s].tokens.size()) - 1, seqs[s].table};
      d.sampling = seqs[s].sampling;
      d.history = seqs[s].tokens;
      d.history_prompt_len = seqs[s].tokens.size();
      batch.push_back(d);
    }
    // Decoding position p rewrites position p's KV with the same values the prefill wrote.
    DecodeResult got, want;
    mk.decode(batch, true, got);
    ref.decode(batch, true, want);
    for (int s = 0; s < 3; ++s) {
      std::span<const float> g(got.logits.data() + s * V, V), r(want.logits.data() + s * V, V);
      expect_close(g, r, cat("step ", step, " sequence ", s));
      const sampling::TokenHistory h{batch[s].history.first(batch[s].history_prompt_len), {}};
      EXPECT_EQ(got.tokens[s], sampling::sample_token(g, seqs[s].sampling, batch[s].chunk.start_pos + 1, h));
    }
    for (int s = 0; s < 3; ++s) seqs[s].tokens.push_back(want.tokens[s]);  // both continue alike
  }
}

// Token masks (DecodeSeq::allowed): cpu-mk samples among allowed tokens only, its token is the host
// sampler's under the mask on its own logits, and a greedy row's token is cpu-ref's under the same
// mask; an unconstrained row in the same batch is unaffected.
TEST(CpuMkBackend, HonoursTokenMasksLikeCpuRef) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig config = test::small_moe_config();
  const test::TestWeights w = test::random_weights(config, Dtype::kBF16, rng.next());
  const int bs = 4, n_blocks = 48, V = config.vocab_size;
  emu::CpuMkBackend mk(config, w.weights, w.store,
                       {.backend = "cpu-mk", .kv_block_size = bs, .n_kv_blocks = n_blocks, .n_threads = 4}, {});
  ref::RefBackend ref(config, w.weights, w.store, {.kv_block_size = bs, .n_kv_blocks = n_blocks, .n_threads = 1});
  struct Seq {
    std::vector<int32_t> tokens, table;
    SamplingParams sampling;
    bool constrained;
  };
  std::vector<Seq> seqs(3);
  for (int s = 0; s < 3; ++s) {
    for (int b = 0; b < 16; ++b) seqs[s].table.push_back(s * 16 + b);
    seqs[s].tokens = test::random_tokens(rng, 1 + static_cast<int>(rng.below(9)), V);
    seqs[s].sampling.temperature = s == 1 ? 0.9f : 0.0f;
    seqs[s].sampling.seed = rng.next();
    seqs[s].constrained = s != 2;
    const SeqChunk chunk{s, seqs[s].tokens, 0, seqs[s].table};
    mk.prefill(chunk, {});
    ref.prefill(chunk, {});
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<DecodeSeq> batch;
    std::vector<int32_t> last(3);
    std::vector<std::vector<uint32_t>> masks(3);
    for (int s = 0; s < 3; ++s) {
      last[s] = seqs[s].tokens.back();
      DecodeSeq d;
      d.chunk = SeqChunk{s, std::span<const int32_t>(&last[s], 1), static_cast<int>(seqs[s].tokens.size()) - 1, seqs[s].table};
      d.sampling = seqs[s].sampling;
      if (seqs[s].constrained) {
        masks[s].assign(token_mask_words(V), 0u);
        const float density = step == 0 ? 0.02f : rng.unit();
        for (int t = 0; t < V; ++t)
          if (rng.unit() < density) masks[s][t >> 5] |= 1u << (t & 31);
        const int one = static_cast<int>(rng.below(V));
        masks[s][one >> 5] |= 1u << (one & 31);
        d.allowed = masks[s];
      }
      batch.push_back(d);
    }
    DecodeResult got, want;
    mk.decode(batch, true, got);
    ref.decode(batch, true, want);
    for (int s = 0; s < 3; ++s) {
      const std::string what = cat("step ", step, " sequence ", s);
      std::span<const float> g(got.logits.data() + s * V, V);
      if (seqs[s].constrained) {
        EXPECT_TRUE(token_mask_allows(masks[s].data(), got.tokens[s])) << what;
        EXPECT_TRUE(token_mask_allows(masks[s].data(), want.tokens[s])) << what << " (cpu-ref)";
      }
      EXPECT_EQ(got.tokens[s], sampling::sample_token(g, seqs[s].sampling, batch[s].chunk.start_pos + 1, {}, masks[s]))
          << what;
      if (seqs[s].sampling.greedy()) {
        EXPECT_EQ(got.tokens[s], want.tokens[s]) << what;
      }
    }
    for (int s = 0; s < 3; ++s) seqs[s].tokens.push_back(want.tokens[s]);
  }
}

TEST(CpuMkBackend, RejectsBadCalls) {
  const ModelConfig config = test::small_moe_config();
  const test::TestWeights w = test::random_weights(config, Dtype::kBF16, 3);
  BackendOptions o{.backend = "cpu-mk", .kv_block_size = 4, .n_kv_blocks = 8};
  emu::CpuMkBackend mk(config, w.weights, w.store, o);
  EXPECT_EQ(mk.name(), "cpu-mk");
  std::vector<int32_t> table{0, 9}, tokens{1, 2}, bad{config.vocab_size};
  std::vector<float> logits(config.vocab_size);
  EXPECT_THROW(mk.prefill(SeqChunk{0, bad, 0, table}, logits), Error);
  try {
    mk.prefill(SeqChunk{0, std::vector<int32_t>{1, 2, 3, 4, 5}, 0, table}, logits);
    FAIL() << "block 9 of 8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside [0, 8)"), std::string::npos) << e.what();
  }
  DecodeSeq d;
  d.chunk = SeqChunk{0, tokens, 0, table};
  DecodeResult r;
  EXPECT_THROW(mk.decode(std::span<const DecodeSeq>(&d, 1), false, r), Error);  // two tokens
  o.n_threads = 133;  // emulated SMs: 1..132
  EXPECT_THROW(emu::CpuMkBackend(config, w.weights, w.store, o), Error);
  o.n_threads = -1;
  EXPECT_THROW(emu::CpuMkBackend(config, w.weights, w.store, o), Error);
}

// Batch invariance: a sequence's logits are bitwise the same alone, in any sub-batch and in the
// whole batch, at contexts long enough for several attention splits (the split geometry must
// come from the sequence's own length, not from the batch's total).
TEST(CpuMkBackend, LogitsDoNotDependOnTheBatch) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig config = test::small_moe_config();
  const test::TestWeights w = test::random_weights(config, Dtype::kBF16, rng.next());
  const int bs = 4, n_seqs = 6, per_seq = 80, V = config.vocab_size;
  BackendOptions o{.backend = "cpu-mk", .kv_block_size = bs, .n_kv_blocks = n_seqs * per_seq, .n_threads = 4};
  emu::CpuMkBackend mk(config, w.weights, w.store, o);
  struct Seq {
    std::vector<int32_t> prompt, table;
    int32_t next = 0;
  };
  std::vector<Seq> seqs(n_seqs);
  for (int s = 0; s < n_seqs; ++s) {
    seqs[s].table.resize(per_seq);
    std::iota(seqs[s].table.begin(), seqs[s].table.end(), s * per_seq);
    // Contexts from 1 (one split) to ~300 (several 64-token splits): ragged, so the batch's
    // total differs from every sequence's own.
    seqs[s].prompt = test::random_tokens(rng, s == 0 ? 1 : 20 + static_cast<int>(rng.below(280)), V);
    seqs[s].next = static_cast<int32_t>(rng.below(V));
    mk.prefill(SeqChunk{s, seqs[s].prompt, 0, seqs[s].table}, {});
  }
  auto run = [&](const std::vector<int>& members) {
    std::vector<DecodeSeq> batch;
    for (int s : members) {
      DecodeSeq d;
      d.chunk = SeqChunk{s, std::span<const int32_t>(&seqs[s].next, 1), static_cast<int>(seqs[s].prompt.size()), seqs[s].table};
      d.sampling.temperature = 0;
      batch.push_back(d);
    }
    DecodeResult r;
    mk.decode(batch, true, r);
    return r.logits;
  };
  std::vector<int> all(n_seqs);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<float> whole = run(all);
  for (int s = 0; s < n_seqs; ++s) {
    const std::vector<float> alone = run({s});
    EXPECT_EQ(std::memcmp(alone.data(), whole.data() + static_cast<size_t>(s) * V, V * sizeof(float)), 0)
        << "sequence " << s << " (context " << seqs[s].prompt.size() + 1 << ") alone differs from the batch of " << n_seqs;
  }
  const std::vector<int> some{4, 1, 5};  // a sub-batch in another order
  const std::vector<float> part = run(some);
  for (size_t i = 0; i < some.size(); ++i)
    EXPECT_EQ(std::memcmp(part.data() + i * V, whole.data() + static_cast<size_t>(some[i]) * V, V * sizeof(float)), 0)
        << "sequence " << some[i] << " in a sub-batch differs from the batch of " << n_seqs;
}

// `generate --backend cpu-mk` runs through the factory and the generate loop: the same greedy
// tokens as cpu-ref (the test model's logits margins are far above fp32 noise).
TEST(CpuMkBackend, FactoryAndGenerateLoopMatchCpuRef) {
  const ModelConfig config = test::small_moe_config();
  const test::TestWeights w = test::random_weights(config, Dtype::kBF16, 11);
  GenerateRequest request;
  request.prompt = {5, 17, 300, 42, 7};
  request.sampling.temperature = 0;
  request.max_tokens = 12;
  request.ignore_eos = true;
  BackendOptions options{.backend = "cpu-mk", .kv_block_size = 4, .n_kv_blocks = blocks_needed(request, 4),
                         .n_threads = 3};
  auto mk = make_backend(config, w.weights, w.store, options);
  options.backend = "cpu-ref";
  auto ref = make_backend(config, w.weights, w.store, options);
  EXPECT_EQ(mk->name(), "cpu-mk");
  std::vector<int32_t> streamed;
  const GenerateResult a = generate(*mk, request, [&](int32_t t) { streamed.push_back(t); });
  const GenerateResult b = generate(*ref, request, [](int32_t) {});
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(streamed, a.tokens);
  EXPECT_EQ(a.finish_reason, "length");
}

}  // namespace
}  // namespace megadecode
