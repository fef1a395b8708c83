// sanitize: address
// Tests of the reference model: semantics against an independent double-precision textbook model
// (qwen3_moe, dense qwen3, and a variant config with parallel blocks, sliding windows, NoPE,
// interleaved RoPE, sigmoid router, tied embeddings), and the bitwise identity of prefill and
// incremental decode across block sizes and shuffled block tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "model/presets.h"
#include "naive_model.h"
#include "ref/ref_backend.h"
#include "ref_test_util.h"

namespace megadecode {
namespace {

using ref::KvStore;
using ref::RefModel;
using ref::ThreadPool;
using test::random_weights;

// A shuffled block table covering n_tokens for a store of n_blocks (blocks drawn without replacement).
std::vector<int32_t> shuffled_table(SplitMix64& rng, int n_tokens, int block_size, int n_blocks) {
  std::vector<int32_t> all(n_blocks);
  std::iota(all.begin(), all.end(), 0);
  for (int i = n_blocks - 1; i > 0; --i) std::swap(all[i], all[rng.below(i + 1)]);
  all.resize((n_tokens + block_size - 1) / block_size);
  return all;
}

std::vector<float> run_all_logits(RefModel& model, KvStore& kv, const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& table) {
  std::vector<float> logits(tokens.size() * model.config().vocab_size);
  model.forward(SeqChunk{1, tokens, 0, table}, kv, logits);
  return logits;
}

void expect_close_to_naive(const ModelConfig& c, Dtype dtype, uint64_t seed) {
  SCOPED_TRACE(cat("model_type ", c.model_type, " dtype ", dtype_name(dtype), " seed ", seed));
  // Draw weights and tokens until no routing decision is a near-tie (then fp32 and double agree
  // on the experts; with a tie they may legitimately differ).
  for (uint64_t attempt = 0; attempt < 20; ++attempt) {
    SplitMix64 rng(seed + attempt);
    test::TestWeights tw = random_weights(c, dtype, rng.next());
    const std::vector<int32_t> tokens = test::random_tokens(rng, 11, c.vocab_size);
    double gap = 0;
    const std::vector<double> want = test::naive_logits(c, tw.weights, tokens, &gap);
    if (gap < 1e-4) continue;
    ThreadPool pool(2);
    RefModel model(c, tw.weights, &pool);
    KvStore kv(c, 3, 8);
    kv.fill(NAN);
    const std::vector<float> got = run_all_logits(model, kv, tokens, shuffled_table(rng, 11, 3, 8));
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "logit " << i;
      max_ref = std::max(max_ref, std::abs(want[i]));
      max_err = std::max(max_err, std::abs(got[i] - want[i]));
    }
    EXPECT_LE(max_err, 2e-5 * max_ref) << "max |logit| " << max_ref;
    return;
  }
  FAIL() << "every draw had a near-tied routing decision";
}

TEST(RefModel, MatchesTextbookModelQwen3Moe) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) expect_close_to_naive(test::small_moe_config(), dtype, seed);
}

TEST(RefModel, MatchesTextbookModelDenseAndVariants) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  expect_close_to_naive(test::dense_config(), Dtype::kBF16, seed);
  expect_close_to_naive(test::variant_config(), Dtype::kBF16, seed);
  ModelConfig sequential_variant = test::variant_config();
  sequential_variant.block = BlockKind::kSequential;
  sequential_variant.norm_topk_prob = true;
  sequential_variant.rope_style = RopeStyle::kNeox;
  expect_close_to_naive(sequential_variant, Dtype::kF32, seed);
}

// cohere2_moe (North Mini Code): the plain structure, then shared experts averaged under
// LayerNorm, then shared experts summed with a renormalised softmax router.
TEST(RefModel, MatchesTextbookModelCohere2Moe) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  ModelConfig c = test::cohere_config();
  expect_close_to_naive(c, Dtype::kBF16, seed);
  c.shared_intermediate_size = 2 * c.moe_intermediate_size;
  c.shared_combine = SharedCombine::kAverage;
  c.norm = NormKind::kLayer;
  c.rms_norm_eps = 1e-5f;
  expect_close_to_naive(c, Dtype::kF32, seed);
  c.shared_combine = SharedCombine::kSum;
  c.norm = NormKind::kRms;
  c.router = RouterKind::kSoftmaxTopK;
  c.norm_topk_prob = true;
  expect_close_to_naive(c, Dtype::kBF16, seed);
}

// Each cohere2_moe feature changes the logits (so the textbook comparison above cannot pass with
// one of them ignored on both sides by accident): logit_scale, the norm kind, a shared expert, the
// combine, a window, RoPE on the full dense layer.
TEST(RefModel, EveryCohere2MoeFeatureChangesTheLogits) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  ModelConfig base = test::cohere_config();
  base.shared_intermediate_size = base.moe_intermediate_size;
  base.shared_combine = SharedCombine::kAverage;
  SplitMix64 rng(seed);
  test::TestWeights tw = random_weights(base, Dtype::kF32, rng.next());
  const std::vector<int32_t> tokens = test::random_tokens(rng, 9, base.vocab_size);
  auto logits = [&](const ModelConfig& c) {
    ThreadPool pool(2);
    RefModel model(c, tw.weights, &pool);
    KvStore kv(c, 4, 4);
    kv.fill(NAN);
    return run_all_logits(model, kv, tokens, {0, 1, 2});
  };
  const std::vector<float> want = logits(base);
  std::vector<std::pair<std::string, ModelConfig>> changed;
  auto add = [&](const char* what, auto edit) {
    ModelConfig c = base;
    edit(c);
    changed.emplace_back(what, c);
  };
  add("logit_scale", [](ModelConfig& c) { c.logit_scale = 1.0f; });
  add("LayerNorm", [](ModelConfig& c) { c.norm = NormKind::kLayer; });
  add("shared sum", [](ModelConfig& c) { c.shared_combine = SharedCombine::kSum; });
  add("no window", [](ModelConfig& c) { c.layers[2].sliding_window = 0; });
  add("no RoPE on layer 0", [](ModelConfig& c) { c.layers[0].use_rope = false; });
  add("RoPE on layer 4", [](ModelConfig& c) { c.layers[4].use_rope = true; });
  add("renormalised", [](ModelConfig& c) { c.norm_topk_prob = true; });
  for (const auto& [what, c] : changed) {
    const std::vector<float> got = logits(c);
    double diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    EXPECT_GT(diff, 1e-4) << what;
  }
}

// Full prefill (logits at every position) versus prefill of a prefix and then one token at a
// time: bitwise equal, for several block sizes with shuffled tables and NaN-poisoned storage.
TEST(RefModel, PrefillThenDecodeEqualsFullRecomputationBitwise) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const ModelConfig& c : {test::small_moe_config(), test::variant_config(), test::cohere_config()}) {
    SplitMix64 rng(seed);
    test::TestWeights tw = random_weights(c, Dtype::kBF16, rng.next());
    ThreadPool pool(2);
    RefModel model(c, tw.weights, &pool);
    const int n = 37;
    const std::vector<int32_t> tokens = test::random_tokens(rng, n, c.vocab_size);
    const size_t vocab = c.vocab_size;
    for (int block_size : {1, 3, 16}) {
      SCOPED_TRACE(cat(c.model_type, " block size ", block_size));
      const int n_blocks = (n + block_size - 1) / block_size + 5;
      KvStore full_kv(c, block_size, n_blocks);
      full_kv.fill(NAN);
      const std::vector<float> full = run_all_logits(model, full_kv, tokens, shuffled_table(rng, n, block_size, n_blocks));

      KvStore kv(c, block_size, n_blocks);
      kv.fill(NAN);
      const std::vector<int32_t> table = shuffled_table(rng, n, block_size, n_blocks);
      const int prefix = 1 + static_cast<int>(rng.below(n - 1));
      std::vector<float> step(prefix * vocab);
      model.forward(SeqChunk{7, std::span(tokens).first(prefix), 0, table}, kv, step);
      ASSERT_EQ(0, std::memcmp(step.data(), full.data(), step.size() * sizeof(float))) << "prefix " << prefix;
      std::vector<float> one(vocab);
      for (int pos = prefix; pos < n; ++pos) {
        model.forward(SeqChunk{7, std::span(tokens).subspan(pos, 1), pos, table}, kv, one);
        ASSERT_EQ(0, std::memcmp(one.data(), full.data() + pos * vocab, vocab * sizeof(float))) << "position " << pos;
      }
    }
  }
}

// Several sequences of different lengths decoded together in one KV store: each one's logits
// equal its logits alone (a sequence does not depend on its batch), bitwise.
TEST(RefModel, BatchDecodeMatchesSequencesAlone) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig c = test::small_moe_config();
  SplitMix64 rng(seed);
  test::TestWeights tw = random_weights(c, Dtype::kBF16, rng.next());
  ref::RefBackend backend(c, tw.weights, tw.store, {.kv_block_size = 3, .n_kv_blocks = 64, .n_threads = 2});
  backend.kv_store().fill(NAN);
  const size_t vocab = c.vocab_size;
  const std::vector<int> lengths = {1, 9, 4, 17};
  const int n_steps = 5;
  std::vector<std::vector<int32_t>> seqs, tables;
  std::vector<int32_t> all_blocks(64);
  std::iota(all_blocks.begin(), all_blocks.end(), 0);
  for (int i = 63; i > 0; --i) std::swap(all_blocks[i], all_blocks[rng.below(i + 1)]);
  size_t next_block = 0;
  for (int len : lengths) {
    seqs.push_back(test::random_tokens(rng, len + n_steps, c.vocab_size));
    const size_t n_blocks = (len + n_steps + 2) / 3;
    tables.emplace_back(all_blocks.begin() + next_block, all_blocks.begin() + next_block + n_blocks);
    next_block += n_blocks;
  }
  // Alone: each sequence in a fresh store, all positions at once.
  std::vector<std::vector<float>> alone;
  for (size_t s = 0; s < seqs.size(); ++s) {
    ThreadPool pool(1);
    RefModel model(c, tw.weights, &pool);
    KvStore kv(c, 3, 64);
    alone.push_back(run_all_logits(model, kv, seqs[s], tables[s]));
  }
  // Together: prefill each, then n_steps decode batches over all sequences.
  for (size_t s = 0; s < seqs.size(); ++s) {
    backend.prefill(SeqChunk{static_cast<int64_t>(s), std::span(seqs[s]).first(lengths[s]), 0, tables[s]}, {});
  }
  for (int step = 0; step < n_steps; ++step) {
    std::vector<DecodeSeq> batch;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int pos = lengths[s] + step;
      DecodeSeq d;
      d.chunk = SeqChunk{static_cast<int64_t>(s), std::span(seqs[s]).subspan(pos, 1), pos, tables[s]};
      d.sampling.temperature = 0.0f;
      batch.push_back(d);
    }
    DecodeResult result;
    backend.decode(batch, true, result);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const size_t pos = lengths[s] + step;
      ASSERT_EQ(0, std::memcmp(result.logits.data() + s * vocab, alone[s].data() + pos * vocab, vocab * sizeof(float)))
          << "sequence " << s << " position " << pos;
    }
  }
}

TEST(RefModel, ThreadCountDoesNotChangeResults) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig c = preset_config("tiny");
  SplitMix64 rng(seed);
  test::TestWeights tw = random_weights(c, Dtype::kBF16, rng.next());
  const std::vector<int32_t> tokens = test::random_tokens(rng, 3, c.vocab_size);
  const std::vector<int32_t> table = {2, 0};
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    RefModel model(c, tw.weights, &pool);
    KvStore kv(c, 2, 3);
    results.push_back(run_all_logits(model, kv, tokens, table));
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)));
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RefModel, BadInputIsAnError) {
  const ModelConfig c = test::small_moe_config();
  test::TestWeights tw = random_weights(c, Dtype::kBF16, 1);
  RefModel model(c, tw.weights, nullptr);
  KvStore kv(c, 4, 3);
  std::vector<float> logits(c.vocab_size);
  const std::vector<int32_t> ok_tokens = {1, 2, 3}, bad_token = {1, 500}, table = {2, 1};
  EXPECT_NE(error_of([&] { model.forward(SeqChunk{0, bad_token, 0, table}, kv, logits); }).find("token id 500"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.forward(SeqChunk{0, ok_tokens, 6, table}, kv, logits); }).find("does not cover"),
            std::string::npos);
  const std::vector<int32_t> bad_table = {0, 3};
  EXPECT_NE(error_of([&] { model.forward(SeqChunk{0, ok_tokens, 3, bad_table}, kv, logits); }).find("names block 3"),
            std::string::npos);
  std::vector<float> wrong(7);
  EXPECT_NE(error_of([&] { model.forward(SeqChunk{0, ok_tokens, 0, table}, kv, wrong); }).find("logits buffer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.forward(SeqChunk{0, {}, 0, table}, kv, logits); }).find("empty chunk"),
            std::string::npos);
  EXPECT_NE(error_of([&] { KvStore bad(c, 0, 3); }).find("block size"), std::string::npos);
}

}  // namespace
}  // namespace megadecode
