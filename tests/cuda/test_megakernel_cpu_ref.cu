// cuda-mk against cpu-ref itself (the fp32 reference backend, src/ref), not the GPU tests' own host
// reference: the `small` preset (full widths, 128 experts, 2 layers) with the same synthetic
// weights on both sides, ragged batches over a shuffled paged KV cache whose history is random
// bf16 (copied into cpu-ref's fp32 store), one decode step. Tolerance (issue 5): max |logit err|
// <= 1e-2 * max |ref| per sequence, greedy tokens equal where the reference's top-2 margin allows.
#include <cstdio>
#include <memory>

#include "model/loader.h"
#include "model/presets.h"
#include "ref/ref_backend.h"
#include "gpu_test_util.h"
#include "test_megakernel_util.h"

namespace megadecode::test {
namespace {

constexpr double kTol = 1e-2;
constexpr int kBlocks = 8000;

// cpu-ref's decode of the same step, after copying the device-layout KV history into its store.
std::vector<std::vector<float>> cpu_ref_step(const ModelConfig& c, const LoadedModel& host, const Case& k) {
  BackendOptions o;
  o.kv_block_size = 16;
  o.n_kv_blocks = kBlocks;
  ref::RefBackend be(c, host.weights, nullptr, o);
  be.kv_store().fill(std::nanf(""));  // anything the step reads must come from the history below
  const int G = c.n_kv_heads, D = c.head_dim, bs = 16;
  for (const RefSeq& s : k.seqs)
    for (int j = 0; j + 1 < s.n_ctx; ++j) {
      const ref::KvStore::Slot slot = be.kv_store().locate(s.table, j);
      for (int L = 0; L < c.n_layers; ++L)
        for (int kvi = 0; kvi < 2; ++kvi) {
          float* dst = kvi == 0 ? be.kv_store().key(L, slot) : be.kv_store().value(L, slot);
          for (int g = 0; g < G; ++g)
            for (int d = 0; d < D; ++d) {
              const int64_t i = ((((static_cast<int64_t>(L) * 2 + kvi) * kBlocks + s.table[j / bs]) * G + g) * bs +
                                 j % bs) * D + d;
              dst[g * D + d] = bf16_bits_to_float(k.kv[i]);
            }
        }
    }
  const std::vector<DecodeSeq> ds = decode_seqs(k);
  DecodeResult r;
  be.decode(ds, true, r);
  std::vector<std::vector<float>> out(k.seqs.size());
  const size_t V = static_cast<size_t>(c.vocab_size);
  for (size_t i = 0; i < out.size(); ++i) out[i].assign(r.logits.begin() + i * V, r.logits.begin() + (i + 1) * V);
  return out;
}

TEST(MegakernelCpuRef, MatchesCpuRefOnSmallPreset) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = test_seed();
  std::printf("small preset, weight and case seed %llu (MEGADECODE_SEED reproduces)\n",
              static_cast<unsigned long long>(seed));
  const LoadedModel host = synthetic_model(c, seed);
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = kBlocks;
  o.kv_block_size = 16;
  cuda::CudaBackend be(cuda::DeviceWeights::synthetic(c, seed), o);
  be.set_poison_activations(true);
  SplitMix64 rng(seed ^ 0x5eedull);
  for (int batch : {1, 3, 8, 17, 64}) {
    const int max_ctx = batch == 64 ? 1024 : 4096;
    const Case k = make_case(c, be, rng, batch, max_ctx, {batch == 64 ? 4096 : 1, 97, 16, 17});
    std::vector<int32_t> tokens;
    const std::vector<float> dev = run_case(be, k, &tokens);
    const Compare cmp = compare(dev, cpu_ref_step(c, host, k), tokens, c.vocab_size, kTol);
    std::printf("batch %2d: max |err| / max |ref| = %.3g (max |ref| %.3g), %d bad rows, %d token mismatches\n", batch,
                cmp.max_err, cmp.max_ref, cmp.n_bad, cmp.token_mismatch);
    EXPECT_EQ(cmp.n_nan, 0) << "batch " << batch << ": unwritten (NaN) logits";
    EXPECT_EQ(cmp.n_bad, 0) << "batch " << batch;
    EXPECT_EQ(cmp.token_mismatch, 0) << "batch " << batch;
  }
}

}  // namespace
}  // namespace megadecode::test
