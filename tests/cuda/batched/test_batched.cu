// GPU tests of the batched decode step (cuda-batched; src/cuda/batched) and of the engine's path
// choice (cuda), on the `small` preset (full widths, 128 experts, 2 layers) over a shuffled,
// noise-filled paged cache with every activation NaN-poisoned before each step:
//   - routing-exact against cpu-ref (routing_exact.h; the prefill path's rounding points, so the
//     mixed near-tie bound) at batches 9, 33, 64 and 256 with ragged contexts;
//   - a sequence's tokens and logits do not depend on its neighbours: bitwise across batches of
//     other buckets and places, and across repeated runs;
//   - the megakernel and the batched step agree within the routing-exact bound on one case;
//   - only each row's new K/V slot is written;
//   - `cuda` takes the path its policy names;
//   - Sanitize.*: a tiny batched step with padding rows, small enough for compute-sanitizer.
#include <cstring>
#include <memory>
#include <string>

#include "core/check.h"
#include "model/loader.h"
#include "model/presets.h"
#include "../test_megakernel_util.h"

namespace megadecode::test {
namespace {

constexpr double kTol = 1e-2;

std::unique_ptr<cuda::CudaBackend> backend(const std::string& name, int n_blocks = 16600) {
  BackendOptions o;
  o.backend = name;
  o.n_kv_blocks = n_blocks;
  o.kv_block_size = 16;
  o.max_batch = 256;
  auto be = std::make_unique<cuda::CudaBackend>(small().dev, o);
  be->probe().set_poison_activations(true);
  return be;
}

// One case through `be` against cpu-ref forced onto the device's routing.
void expect_matches_reference(cuda::CudaBackend& be, const Case& k, const std::string& what) {
  Small& s = small();
  std::vector<int32_t> tokens;
  RoutingLog routing;
  const std::vector<float> dev = run_case(be, k, &tokens, &routing);
  RoutingAudit audit;
  const auto ref = cpu_ref_step(s.config, s.host.weights, k, be.n_kv_blocks(), routing, true, audit);
  expect_routing_exact(audit, static_cast<int64_t>(k.seqs.size()) * s.config.n_layers, kRouteNearTieMixed, what);
  const Compare cmp = compare(dev, ref, tokens, s.config.vocab_size, kTol);
  std::printf("%s: max |err| / max |ref| = %.3g (max |ref| %.3g), %d rows over the bound, %d token mismatches\n",
              what.c_str(), cmp.max_err, cmp.max_ref, cmp.n_bad, cmp.token_mismatch);
  EXPECT_EQ(cmp.n_nan, 0) << what << ": unwritten (NaN) logits";
  EXPECT_EQ(cmp.n_bad, 0) << what;
  EXPECT_EQ(cmp.token_mismatch, 0) << what;
}

TEST(Batched, MatchesReferenceRaggedBatches) {
  MD_REQUIRE_GPU();
  Small& s = small();
  auto be = backend("cuda-batched");
  const uint64_t case_seed = test_seed();
  std::printf("case seed %llu (MEGADECODE_SEED reproduces weights and cases)\n", static_cast<unsigned long long>(case_seed));
  SplitMix64 rng(case_seed);
  const std::vector<int> batches = gpu_quick() ? std::vector<int>{9, 64} : std::vector<int>{9, 33, 64, 256};
  for (int batch : batches) {
    const int max_ctx = batch >= 64 ? 1024 : 4096;
    // Contexts at the split and tile edges first: 1, 16, 17, 511..513, 1024, 1025, 2000.
    const Case k = make_case(s.config, *be, rng, batch, max_ctx, {1, 16, 17, 511, 512, 513, 1024, 1025, batch < 64 ? 2000 : 97});
    expect_matches_reference(*be, k, "batched, batch " + std::to_string(batch));
    EXPECT_EQ(be->last_path(), DecodePath::kBatched);
  }
}

// A sequence's logits must not depend on its batch: the same rows in batches of other buckets,
// at other places, and run again, are bitwise the same.
TEST(Batched, BatchInvarianceBitwise) {
  MD_REQUIRE_GPU();
  Small& s = small();
  auto be = backend("cuda-batched");
  SplitMix64 rng(test_seed());
  const size_t V = static_cast<size_t>(s.config.vocab_size);
  const Case big = make_case(s.config, *be, rng, 200, 1000, {3000, 4096});
  std::vector<int32_t> big_tokens;
  const std::vector<float> all = run_case(*be, big, &big_tokens);
  const std::vector<float> again = run_case(*be, big);
  EXPECT_EQ(std::memcmp(all.data(), again.data(), all.size() * 4), 0) << "repeated run";
  for (int probe : {0, 1, 57, 199}) {
    for (int batch : {1, 9, 64}) {
      // The probe at a random place among batch - 1 other rows of `big` (distinct sequences).
      std::vector<int> others;
      for (int i = 0; i < static_cast<int>(big.seqs.size()); ++i)
        if (i != probe) others.push_back(i);
      for (int i = static_cast<int>(others.size()) - 1; i > 0; --i) std::swap(others[i], others[rng.below(i + 1)]);
      others.resize(batch - 1);
      const int at = static_cast<int>(rng.below(batch));
      others.insert(others.begin() + at, probe);
      Case k = big;
      k.seqs.clear();
      k.sampling.clear();
      for (int i : others) {
        k.seqs.push_back(big.seqs[i]);
        k.sampling.push_back(big.sampling[i]);
      }
      std::vector<int32_t> tokens;
      const std::vector<float> part = run_case(*be, k, &tokens);
      EXPECT_EQ(std::memcmp(part.data() + at * V, all.data() + probe * V, V * 4), 0)
          << "probe " << probe << " at " << at << " in a batch of " << batch;
      EXPECT_EQ(tokens[at], big_tokens[probe]) << "probe " << probe;
    }
  }
}

// The two paths on one case: each routing-exact against cpu-ref (so within the bound of each other).
TEST(Batched, MegakernelAndBatchedAgreeWithinTheRoutingExactBound) {
  MD_REQUIRE_GPU();
  Small& s = small();
  auto mk = backend("cuda-mk"), bt = backend("cuda-batched");
  SplitMix64 rng(test_seed());
  const Case k = make_case(s.config, *mk, rng, 33, 3000);
  expect_matches_reference(*mk, k, "megakernel, batch 33");
  expect_matches_reference(*bt, k, "batched, batch 33");
  std::vector<int32_t> tm, tb;
  const std::vector<float> a = run_case(*mk, k, &tm), b = run_case(*bt, k, &tb);
  double err = 0, mref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    mref = std::max(mref, std::fabs(static_cast<double>(a[i])));
  }
  std::printf("megakernel vs batched, batch 33: max |diff| / max |logit| = %.3g\n", err / mref);
}

// The step writes each row's new K/V slot and nothing else in the cache.
TEST(Batched, WritesOnlyEachRowsNewSlot) {
  MD_REQUIRE_GPU();
  Small& s = small();
  auto be = backend("cuda-batched", 4000);
  SplitMix64 rng(test_seed());
  const Case k = make_case(s.config, *be, rng, 21, 700);
  (void)run_case(*be, k);
  std::vector<uint16_t> after(k.kv.size());
  ASSERT_EQ(cudaMemcpy(after.data(), be->kv_cache(), after.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  const int bs = be->kv_block_size(), G = s.config.n_kv_heads, D = s.config.head_dim, nb = be->n_kv_blocks();
  std::vector<char> mine(after.size(), 0);
  for (const CaseSeq& q : k.seqs) {
    const int p = q.n_ctx - 1;
    for (int L = 0; L < s.config.n_layers; ++L)
      for (int kvi = 0; kvi < 2; ++kvi)
        for (int g = 0; g < G; ++g)
          for (int d = 0; d < D; ++d)
            mine[((((static_cast<int64_t>(L) * 2 + kvi) * nb + q.table[p / bs]) * G + g) * bs + p % bs) * D + d] = 1;
  }
  int64_t stray = 0, unwritten = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    if (mine[i]) unwritten += after[i] == k.kv[i];  // the noise was |x| >= 1000: a real K/V differs
    else stray += after[i] != k.kv[i];
  }
  EXPECT_EQ(stray, 0) << "K/V written outside the rows' new slots";
  EXPECT_EQ(unwritten, 0) << "new slots left as they were";
}

TEST(Batched, CudaBackendTakesThePathItsPolicyNames) {
  MD_REQUIRE_GPU();
  Small& s = small();
  auto be = backend("cuda");
  SplitMix64 rng(test_seed());
  const DecodePathPolicy& policy = be->path_policy();
  for (int batch : {1, policy.batched_from_batch - 1, policy.batched_from_batch, 65, 130}) {
    if (batch < 1) continue;
    const Case k = make_case(s.config, *be, rng, batch, 300);
    (void)run_case(*be, k);
    EXPECT_EQ(be->last_path(), policy.choose(batch)) << "batch " << batch;
  }
  EXPECT_EQ(be->max_decode_batch(), 256);
  EXPECT_EQ(backend("cuda-mk")->max_decode_batch(), 64);
}

// compute-sanitizer's case (scripts/gpu sanitize): the tiny preset, a batch of 11 (5 padding rows in
// its bucket), contexts over several splits; routing-exact against cpu-ref.
TEST(Sanitize, BatchedTiny) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  const uint64_t seed = test_seed();
  std::printf("tiny preset, seed %llu\n", static_cast<unsigned long long>(seed));
  const LoadedModel host = synthetic_model(c, seed);
  BackendOptions o;
  o.backend = "cuda-batched";
  o.n_kv_blocks = 1200;
  o.kv_block_size = 16;
  o.max_batch = 16;
  o.prefill_chunk = 0;
  cuda::CudaBackend be(cuda::DeviceWeights::synthetic(c, seed), o);
  be.probe().set_poison_activations(true);
  SplitMix64 rng(seed);
  const Case k = make_case(c, be, rng, 11, 1300, {1, 513, 1200});
  std::vector<int32_t> tokens;
  RoutingLog routing;
  const std::vector<float> dev = run_case(be, k, &tokens, &routing);
  RoutingAudit audit;
  const auto ref = cpu_ref_step(c, host.weights, k, be.n_kv_blocks(), routing, true, audit);
  expect_routing_exact(audit, static_cast<int64_t>(k.seqs.size()) * c.n_layers, kRouteNearTieMixed, "tiny batched");
  const Compare cmp = compare(dev, ref, tokens, c.vocab_size, kTol);
  EXPECT_EQ(cmp.n_nan, 0);
  EXPECT_EQ(cmp.n_bad, 0);
}

}  // namespace
}  // namespace megadecode::test
