// GPU test on the full qwen3-30b-a3b shape (48 layers, ~61 GB of synthetic weights generated on
// the GPU): cuda-mk against cuda-ops (the same tile code launched per op) for ragged batches, and a
// few greedy decode steps that feed each sampled token back. Needs an 80+ GB GPU.
#include <cstring>
#include <memory>

#include "model/presets.h"
#include "../test_megakernel_util.h"

namespace megadecode::test {
namespace {

TEST(MegakernelFull, MatchesCudaOpsOnTheFullShape) {
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  const uint64_t seed = test_seed();
  std::printf("qwen3-30b-a3b shape, weight seed %llu\n", static_cast<unsigned long long>(seed));
  std::shared_ptr<cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, seed);
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = 1500;  // 1.5 MB per block of 16 tokens over 48 layers
  cuda::CudaBackend mk(w, o);
  o.backend = "cuda-ops";
  cuda::CudaBackend ops(w, o);
  mk.probe().set_poison_activations(true);
  ops.probe().set_poison_activations(true);
  SplitMix64 rng(seed);
  for (int batch : {1, 8}) {
    Case k = make_case(c, mk, rng, batch, 2048);
    std::vector<int32_t> ta, tb;
    const std::vector<float> a = run_case(mk, k, &ta);
    const std::vector<float> b = run_case(ops, k, &tb);
    ASSERT_EQ(a.size(), b.size());
    double err = 0, mref = 0;
    int nan = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!std::isfinite(a[i])) ++nan;
      err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
      mref = std::max(mref, std::fabs(static_cast<double>(b[i])));
    }
    std::printf("batch %d: max |mk - ops| = %.3g, max |ops| = %.3g\n", batch, err, mref);
    EXPECT_EQ(nan, 0);
    EXPECT_LE(err, 1e-2 * mref);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "same tiles, same plan: expected bitwise equal";
    EXPECT_EQ(ta, tb);
    EXPECT_EQ(mk.probe().check_counter_totals(), "");
  }
  // Greedy decoding: each step's token becomes the next input.
  Case k = make_case(c, mk, rng, 4, 100);
  if (cudaMemcpy(mk.kv_cache(), k.kv.data(), k.kv.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) FAIL();
  for (int step = 0; step < 4; ++step) {
    std::vector<DecodeSeq> ds(k.seqs.size());
    for (size_t i = 0; i < k.seqs.size(); ++i) {
      ds[i].chunk.tokens = std::span<const int32_t>(&k.seqs[i].token, 1);
      ds[i].chunk.start_pos = k.seqs[i].n_ctx - 1;
      const int need = (k.seqs[i].n_ctx + 15) / 16;
      while (static_cast<int>(k.seqs[i].table.size()) < need) k.seqs[i].table.push_back(1400 + static_cast<int>(i) * 20 + static_cast<int>(k.seqs[i].table.size()));
      ds[i].chunk.block_table = k.seqs[i].table;
      ds[i].sampling.temperature = 0.0f;
    }
    DecodeResult r;
    mk.decode(ds, false, r);
    for (size_t i = 0; i < k.seqs.size(); ++i) {
      ASSERT_GE(r.tokens[i], 0);
      ASSERT_LT(r.tokens[i], c.vocab_size);
      k.seqs[i].token = r.tokens[i];
      ++k.seqs[i].n_ctx;
    }
  }
}

}  // namespace
}  // namespace megadecode::test
