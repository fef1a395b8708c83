// The routing-exact machinery on the CPU (model/routing.h, cpu-ref's forced routing and device
// rounding): the tie gap of a forced set, the routing log, and cpu-ref run on a routing log —
// its own recorded routing reproduces its logits bitwise with nothing to report, a routing with
// one expert swapped is used (the logits move) and audited with the swap's exact gap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "model/routing.h"
#include "ref/math.h"
#include "ref/ref_backend.h"
#include "ref_test_util.h"

namespace megadecode {
namespace {

TEST(RoutingGap, OwnSetIsNoDifferenceAndASwapIsItsGap) {
  const std::vector<float> p = {0.05f, 0.30f, 0.20f, 0.10f, 0.35f};  // ranks: 4, 1, 2, 3, 0
  bool differs = true;
  EXPECT_EQ(forced_route_gap(p, std::vector<int32_t>{1, 4}, &differs), 0.0);
  EXPECT_FALSE(differs);
  EXPECT_EQ(forced_route_gap(p, std::vector<int32_t>{4, 1, 2}, &differs), 0.0);  // order is not a difference
  EXPECT_FALSE(differs);
  // Top-2 is {4, 1}; forcing {4, 2} drops 1 (0.30) for 2 (0.20): gap (0.30 - 0.20) / p_2 = 0.1 / 0.30.
  EXPECT_NEAR(forced_route_gap(p, std::vector<int32_t>{4, 2}, &differs), (0.30 - 0.20) / 0.30, 1e-6);
  EXPECT_TRUE(differs);
  // Two swaps: drops 4 and 1, adds 3 and 0: (0.35 - 0.05) / 0.30.
  EXPECT_NEAR(forced_route_gap(p, std::vector<int32_t>{3, 0}, &differs), (0.35 - 0.05) / 0.30, 1e-6);
  // Exact ties go to the lower id, so {0, 1} is the own set of equal scores.
  EXPECT_EQ(forced_route_gap(std::vector<float>{1, 1, 1}, std::vector<int32_t>{0, 1}, &differs), 0.0);
  EXPECT_FALSE(differs);
  EXPECT_EQ(forced_route_gap(std::vector<float>{1, 1, 1}, std::vector<int32_t>{0, 2}, &differs), 0.0);
  EXPECT_TRUE(differs);  // a difference with a zero gap: an exact tie
  EXPECT_THROW(forced_route_gap(p, std::vector<int32_t>{1, 1}, &differs), Error);
  EXPECT_THROW(forced_route_gap(p, std::vector<int32_t>{1, 5}, &differs), Error);
}

TEST(RoutingLog, RecordsAndFindsByTokenAndChecksShapes) {
  RoutingLog log(2, 3);
  log.record(7, 4, std::vector<int32_t>{1, 2, 3, 4, 5, 6}, std::vector<float>{.1f, .2f, .3f, .4f, .5f, .6f});
  ASSERT_NE(log.find(7, 4), nullptr);
  EXPECT_EQ(log.find(7, 4)->experts[4], 5);
  EXPECT_EQ(log.find(7, 5), nullptr);
  EXPECT_EQ(log.find(6, 4), nullptr);
  EXPECT_THROW(log.record(7, 5, std::vector<int32_t>{1, 2, 3}, std::vector<float>{.1f, .2f, .3f}), Error);
  RoutingAudit a;
  a.n_forced = 10;
  a.diffs = {{7, 4, 1, 5e-4}, {7, 5, 0, 3e-3}};
  EXPECT_DOUBLE_EQ(a.max_gap(), 3e-3);
  ASSERT_EQ(a.beyond(1e-3).size(), 1u);
  EXPECT_EQ(a.beyond(1e-3)[0].pos, 5);
  EXPECT_NE(a.summary().find("2 differ"), std::string::npos);
}

struct RefRun {
  std::vector<float> logits;  // [n_tokens, vocab]
  RoutingLog log;
  RoutingAudit audit;
};

RefRun run_ref(const ModelConfig& c, const test::TestWeights& w, const std::vector<int32_t>& tokens, bool device_rounding,
        const RoutingLog* forced) {
  const BackendOptions o{.backend = "cpu-ref", .kv_block_size = 4, .n_kv_blocks = 16, .n_threads = 2};
  ref::RefBackend be(c, w.weights, w.store, o);
  RefRun r;
  r.log = RoutingLog(c.n_layers, c.n_experts_per_tok);
  be.set_device_rounding(device_rounding);
  be.set_routing_record(&r.log);
  be.set_forced_routing(forced, &r.audit);
  std::vector<int32_t> table(16);
  std::iota(table.begin(), table.end(), 0);
  r.logits.assign(tokens.size() * c.vocab_size, 0.0f);
  be.prefill_all_logits(SeqChunk{3, tokens, 0, table}, r.logits);
  return r;
}

TEST(ForcedRouting, OwnRoutingReproducesTheLogitsAndASwapIsAuditedExactly) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig c = test::small_moe_config();
  const test::TestWeights w = test::random_weights(c, Dtype::kBF16, seed);
  SplitMix64 rng(seed);
  std::vector<int32_t> tokens(9);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(c.vocab_size));
  for (bool rounding : {false, true}) {
    const RefRun own = run_ref(c, w, tokens, rounding, nullptr);
    EXPECT_EQ(own.audit.n_forced, 0);
    ASSERT_EQ(own.log.size(), tokens.size());
    const RefRun again = run_ref(c, w, tokens, rounding, &own.log);
    EXPECT_EQ(again.audit.n_forced, static_cast<int64_t>(tokens.size()) * c.n_layers);
    EXPECT_TRUE(again.audit.diffs.empty()) << again.audit.summary();
    EXPECT_EQ(again.logits, own.logits) << "forcing a model's own routing must change nothing";
  }
  // Device rounding is a different computation (bf16 at the device's rounding points).
  EXPECT_NE(run_ref(c, w, tokens, false, nullptr).logits, run_ref(c, w, tokens, true, nullptr).logits);

  // Token 5, layer 1: replace the K-th expert by one outside the reference's own set.
  const RefRun own = run_ref(c, w, tokens, false, nullptr);
  RoutingLog swapped = own.log;
  const int K = c.n_experts_per_tok, pos = 5, layer = 1;
  TokenRouting t = *swapped.find(3, pos);
  const int32_t kth = t.experts[layer * K + K - 1];
  int32_t next = -1;
  for (int e = 0; e < c.n_experts && next < 0; ++e)
    if (std::find(t.experts.begin() + layer * K, t.experts.begin() + (layer + 1) * K, e) ==
        t.experts.begin() + (layer + 1) * K)
      next = e;  // some expert outside the set
  ASSERT_GE(next, 0);
  t.experts[layer * K + K - 1] = next;
  swapped.record(3, pos, t.experts, t.weights);
  const RefRun forced = run_ref(c, w, tokens, false, &swapped);
  // The swap is audited once; it changes the hidden state downstream (the token's later layers, the
  // later tokens through the KV cache), where the rest of the log may then differ from the
  // reference's own choice too, but nothing before it may.
  const RouteDiff* at_swap = nullptr;
  for (const RouteDiff& d : forced.audit.diffs) {
    EXPECT_TRUE(d.pos > pos || (d.pos == pos && d.layer >= layer))
        << "a diff upstream of the swap, at pos " << d.pos << " layer " << d.layer << ": " << forced.audit.summary();
    if (d.pos == pos && d.layer == layer) {
      EXPECT_EQ(at_swap, nullptr) << "the swap audited twice: " << forced.audit.summary();
      at_swap = &d;
    }
  }
  ASSERT_NE(at_swap, nullptr) << "the swap is not audited: " << forced.audit.summary();
  EXPECT_GE(at_swap->gap, 0.0);  // the dropped expert ranked at least as high as the added one
  // The forced expert is used: the recorded choice is the forced one, and the logits from the
  // swapped token on moved while those before it did not.
  const TokenRouting& used = *forced.log.find(3, pos);
  EXPECT_EQ(used.experts[layer * K + K - 1], next);
  EXPECT_EQ(std::find(used.experts.begin() + layer * K, used.experts.begin() + (layer + 1) * K, kth),
            used.experts.begin() + (layer + 1) * K);
  const size_t V = c.vocab_size;
  EXPECT_TRUE(std::equal(own.logits.begin(), own.logits.begin() + pos * V, forced.logits.begin()));
  EXPECT_FALSE(std::equal(own.logits.begin() + pos * V, own.logits.begin() + (pos + 1) * V, forced.logits.begin() + pos * V));
  // Its weights are the reference's own probabilities of the forced set, renormalised.
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += used.weights[layer * K + k];
  EXPECT_NEAR(sum, 1.0f, 1e-6f);
}

}  // namespace
}  // namespace megadecode
