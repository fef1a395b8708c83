// One tie rule for every sampler (sampling/params.h: the lower token id wins), fed exact ties:
// the host sampler, the device row sampler in a standalone CTA (1024 threads) and the
// megakernel's SAMPLE op (cuda-mk and cuda-ops) must pick the same token from the same logits.
// The `tiny` model's LM head gets the step's argmax row copied into three other rows, so the device
// computes four bitwise-equal top logits; settings that keep one token (greedy, top-k 1, a tiny
// top-p) must pick the lowest of the four ids, the others must agree with the host's draw.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "../gpu_test_util.h"
#include "cuda/common/kernels.h"
#include "model/loader.h"
#include "model/presets.h"
#include "sampling/host_sampler.h"

namespace megadecode::test {
namespace {

constexpr int kPromptLen = 5;

struct Step {
  std::vector<float> logits;  // [vocab]
  int32_t token = -1;
};

// Prefills the prompt, then decodes its next token under `sp` at position kPromptLen.
Step decode_step(cuda::CudaBackend& be, const std::vector<int32_t>& prompt, const SamplingParams& sp) {
  const std::vector<int32_t> table = {0, 1};
  be.prefill(SeqChunk{0, std::span(prompt).first(kPromptLen - 1), 0, table, {}}, {});
  DecodeSeq d;
  d.chunk = SeqChunk{0, std::span(prompt).subspan(kPromptLen - 1, 1), kPromptLen - 1, table, {}};
  d.sampling = sp;
  DecodeResult r;
  be.decode(std::span<const DecodeSeq>(&d, 1), true, r);
  return {r.logits, r.tokens.at(0)};
}

int32_t standalone_token(const std::vector<float>& logits, const SamplingParams& sp, int64_t position) {
  const int vocab = static_cast<int>(logits.size());
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<SamplingParams> dp(std::vector<SamplingParams>{sp});
  DeviceBuffer<int64_t> dpos(std::vector<int64_t>{position});
  DeviceBuffer<int32_t> tok(1);
  tok.fill_bytes(0xFF);
  cuda::sample_tokens(dl.get(), vocab, 1, vocab, dp.get(), dpos.get(), tok.get(), 1024, nullptr);
  return tok.download()[0];
}

TEST(SamplingTies, HostStandaloneAndMegakernelPickTheLowerId) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("tiny");
  const uint64_t seed = seed_for("SamplingTies");
  SplitMix64 rng(seed);
  const LoadedModel host = synthetic_model(c, seed);
  std::vector<int32_t> prompt(kPromptLen);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng.below(c.vocab_size));
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = 4;

  // The untouched model's greedy token: the row every tied row copies.
  int32_t top = -1;
  {
    cuda::CudaBackend be(cuda::DeviceWeights::upload(c, host.weights), o);
    top = decode_step(be, prompt, SamplingParams{.temperature = 0.0f}).token;
  }
  ASSERT_GE(top, 0);
  std::vector<int32_t> tied = {top};
  for (int32_t id : {3, 7777, c.vocab_size - 2})
    if (id != top) tied.push_back(id);
  tied.resize(4, c.vocab_size - 1);
  std::sort(tied.begin(), tied.end());
  ModelWeights w = host.weights;
  const size_t row_bytes = static_cast<size_t>(c.hidden_size) * dtype_bytes(w.lm_head.dtype);
  std::vector<std::byte> lm_head(w.lm_head.data, w.lm_head.data + w.lm_head.n_bytes());
  for (int32_t id : tied)
    std::memcpy(lm_head.data() + id * row_bytes, w.lm_head.data + static_cast<size_t>(top) * row_bytes, row_bytes);
  w.lm_head.data = lm_head.data();
  std::shared_ptr<const cuda::DeviceWeights> dev = cuda::DeviceWeights::upload(c, w);

  struct Setting {
    SamplingParams sp;
    bool keeps_one;  // the kept set is the lowest tied id alone
  };
  const Setting settings[] = {
      {SamplingParams{.temperature = 0.0f, .seed = seed}, true},
      {SamplingParams{.temperature = 1e-6f, .seed = seed}, true},
      {SamplingParams{.temperature = 1.0f, .top_k = 1, .seed = seed}, true},
      {SamplingParams{.temperature = 0.7f, .top_p = 1e-6f, .seed = seed}, true},
      {SamplingParams{.temperature = 1.0f, .top_k = 2, .seed = seed}, false},
      {SamplingParams{.temperature = 1.0f, .top_k = 3, .top_p = 0.9f, .seed = seed + 1}, false},
      {SamplingParams{.temperature = 1.3f, .seed = seed + 2}, false}};
  for (const char* backend : {"cuda-mk", "cuda-ops"}) {
    o.backend = backend;
    cuda::CudaBackend be(dev, o);
    for (const Setting& s : settings) {
      SCOPED_TRACE(::testing::Message() << backend << " T=" << s.sp.temperature << " k=" << s.sp.top_k
                                        << " p=" << s.sp.top_p);
      const Step step = decode_step(be, prompt, s.sp);
      ASSERT_EQ(step.logits.size(), static_cast<size_t>(c.vocab_size));
      const float max_logit = *std::max_element(step.logits.begin(), step.logits.end());
      for (int32_t id : tied)
        ASSERT_TRUE(bitwise_equal(&step.logits[id], &max_logit, 4)) << "row " << id << " is not an exact top tie";
      const int32_t lowest =
          static_cast<int32_t>(std::find(step.logits.begin(), step.logits.end(), max_logit) - step.logits.begin());
      ASSERT_LE(lowest, tied.front());
      const int64_t position = kPromptLen;  // the position the sampled token takes
      const int32_t on_host = sampling::sample_token(step.logits, s.sp, position, {});
      EXPECT_EQ(step.token, on_host) << "megakernel vs host";
      EXPECT_EQ(standalone_token(step.logits, s.sp, position), on_host) << "standalone vs host";
      if (s.keeps_one) EXPECT_EQ(on_host, lowest);
    }
  }
}

}  // namespace
}  // namespace megadecode::test
