// The cohere2_moe (North) test scenario shared by the emulator's tests (cpu-mk against cpu-ref) and
// the GPU's (cuda-mk, cuda-ops against cpu-ref): sequences with prompts, then decode steps of the
// whole batch, over one KvCache (both pools) that every backend's tables come from.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/routing.h"
#include "ref_test_util.h"

namespace megadecode::test {

// The config with every sliding layer's window set to `window`.
inline ModelConfig with_window(ModelConfig c, int window) {
  for (LayerSpec& l : c.layers)
    if (l.sliding_window > 0) l.sliding_window = window;
  return c;
}

// max |got - want| / max |want| over one row; NaN when got has a non-finite value.
inline double rel_err(std::span<const float> got, std::span<const float> want) {
  double err = 0, m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
    m = std::max(m, static_cast<double>(std::fabs(want[i])));
  }
  return err / std::max(m, 1e-30);
}

inline int moe_layers(const ModelConfig& c) {
  int n = 0;
  for (int l = 0; l < c.n_layers; ++l) n += c.is_moe_layer(l);
  return n;
}

// Logits rows of a run: each prompt's last position, then each step's rows (sequence order).
struct NorthScenario {
  ModelConfig config;
  int block = 0;  // the KV block size
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> steps;  // [step][seq] the input token
  int n_full = 0, n_ring = 0, ring_len = 0;
};

// n_seqs prompts of [min_prompt, max_prompt] random tokens and n_steps decode steps; both pools
// sized to hold every sequence to its end.
inline NorthScenario make_north_scenario(const ModelConfig& c, int block, SplitMix64& rng, int n_seqs, int min_prompt,
                                         int max_prompt, int n_steps) {
  NorthScenario sc;
  sc.config = c;
  sc.block = block;
  sc.ring_len = kv_ring_length(c.max_sliding_window(), block);
  int total = 0;
  for (int s = 0; s < n_seqs; ++s) {
    const int n = min_prompt + static_cast<int>(rng.below(max_prompt - min_prompt + 1));
    sc.prompts.push_back(random_tokens(rng, n, c.vocab_size));
    total += (n + n_steps + block - 1) / block;
  }
  for (int t = 0; t < n_steps; ++t) sc.steps.push_back(random_tokens(rng, n_seqs, c.vocab_size));
  sc.n_full = total + 3;
  sc.n_ring = n_seqs * sc.ring_len + 1;
  return sc;
}

struct NorthRun {
  std::vector<std::vector<float>> rows;
  RoutingLog log;
};

// Runs the scenario on `be` (a fresh backend): each prompt whole, then the steps; sequence ids
// 10, 11, ...
inline void run_north_scenario(const NorthScenario& sc, Backend& be, NorthRun& out) {
  const ModelConfig& c = sc.config;
  const size_t V = c.vocab_size;
  KvCache cache(sc.n_full, sc.block, false, sc.n_ring, sc.ring_len);
  const int n = static_cast<int>(sc.prompts.size());
  std::vector<int> ctx(n);
  for (int s = 0; s < n; ++s) {
    const int64_t id = 10 + s;
    cache.admit(id, cache.plan_admission(sc.prompts[s], 0, 1));
    ASSERT_TRUE(cache.ensure(id, static_cast<int>(sc.prompts[s].size())));
    std::vector<float> logits(V, NAN);
    be.prefill(SeqChunk{id, sc.prompts[s], 0, cache.table(id), cache.ring_table(id)}, logits);
    out.rows.push_back(logits);
    ctx[s] = static_cast<int>(sc.prompts[s].size());
  }
  for (const std::vector<int32_t>& step : sc.steps) {
    std::vector<DecodeSeq> batch(n);
    for (int s = 0; s < n; ++s) {
      const int64_t id = 10 + s;
      ASSERT_TRUE(cache.ensure(id, ctx[s] + 1));
      batch[s].chunk =
          SeqChunk{id, std::span<const int32_t>(&step[s], 1), ctx[s], cache.table(id), cache.ring_table(id)};
      batch[s].sampling.temperature = 0;
    }
    DecodeResult r;
    be.decode(batch, true, r);
    ASSERT_EQ(r.logits.size(), n * V);
    for (int s = 0; s < n; ++s) out.rows.emplace_back(r.logits.begin() + s * V, r.logits.begin() + (s + 1) * V);
    for (int& x : ctx) ++x;
  }
  for (int s = 0; s < n; ++s) EXPECT_LE(static_cast<int>(cache.ring_table(10 + s).size()), sc.ring_len);
}

// Sequence s of the scenario alone: its prompt and its token of every step.
inline NorthScenario north_alone(const NorthScenario& sc, int s) {
  NorthScenario one = sc;
  one.prompts = {sc.prompts[s]};
  one.steps.clear();
  for (const auto& step : sc.steps) one.steps.push_back({step[s]});
  return one;
}

// Sequence s run alone (north_alone) gave bitwise its rows of the batch of n sequences.
inline void expect_alone_rows_equal(const NorthRun& alone, const NorthRun& batch, const NorthScenario& sc, int s) {
  const size_t V = sc.config.vocab_size, n = sc.prompts.size();
  ASSERT_EQ(alone.rows.size(), 1 + sc.steps.size());
  EXPECT_EQ(std::memcmp(alone.rows[0].data(), batch.rows[s].data(), V * 4), 0) << "sequence " << s << " prompt";
  for (size_t t = 0; t < sc.steps.size(); ++t)
    EXPECT_EQ(std::memcmp(alone.rows[1 + t].data(), batch.rows[n + t * n + s].data(), V * 4), 0)
        << "sequence " << s << " step " << t << " alone differs from the batch of " << n;
}

// Two runs' routing logs: the same tokens, the same experts and weights (bitwise).
inline void expect_same_routing(const RoutingLog& a, const RoutingLog& b) {
  EXPECT_EQ(a.tokens().size(), b.tokens().size());
  for (const auto& [key, tr] : a.tokens()) {
    const TokenRouting* o = b.find(key.first, key.second);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(tr.experts, o->experts);
    EXPECT_EQ(tr.weights, o->weights);
  }
}

}  // namespace megadecode::test
