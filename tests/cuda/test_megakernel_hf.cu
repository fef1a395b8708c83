// cuda-mk (and cuda-ops) against the external oracle: Hugging Face transformers'
// Qwen3MoeForCausalLM in fp32 on the `small` preset written by `make-model --preset small --seed 0`
// (the GPU's synthetic weights for seed 0 are bit-identical to that checkpoint). scripts/hf_oracle
// makes the golden file on the GPU machine and scripts/gpu points MEGADECODE_HF_GOLDEN_SMALL at it
// (format: scripts/hf_reference.py). Each sequence runs its prompt but the last token through
// prefill, then the last token as a decode step: the step's logits must be within
// 1e-2 * max |ref| of transformers', and the greedy token equal where the top-2 margin allows.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda/backend/cuda_backend.h"
#include "gpu_test_util.h"
#include "model/presets.h"

namespace megadecode::test {
namespace {

TEST(MegakernelHf, MatchesTransformersOnSmallPreset) {
  MD_REQUIRE_GPU();
  const char* prefix = std::getenv("MEGADECODE_HF_GOLDEN_SMALL");
  ASSERT_NE(prefix, nullptr) << "set MEGADECODE_HF_GOLDEN_SMALL to the golden file prefix made by scripts/hf_oracle";
  std::ifstream meta_in(std::string(prefix) + ".json");
  ASSERT_TRUE(meta_in.good()) << "cannot open " << prefix << ".json";
  const nlohmann::json meta = nlohmann::json::parse(meta_in);
  ASSERT_EQ(meta.at("format"), "megadecode-hf-logits-v1");
  ASSERT_EQ(meta.at("dtype"), "float32");
  const ModelConfig c = preset_config("small");
  const int V = meta.at("vocab_size");
  ASSERT_EQ(V, c.vocab_size);
  const size_t n_floats = meta.at("n_floats");
  std::vector<float> golden(n_floats);
  std::ifstream f32(std::string(prefix) + ".f32", std::ios::binary);
  f32.read(reinterpret_cast<char*>(golden.data()), static_cast<std::streamsize>(n_floats * 4));
  ASSERT_EQ(static_cast<size_t>(f32.gcount()), n_floats * 4) << prefix << ".f32 is shorter than its metadata says";

  std::shared_ptr<const cuda::DeviceWeights> dev = cuda::DeviceWeights::synthetic(c, 0);
  for (bool per_op : {false, true}) {
    BackendOptions o;
    o.backend = per_op ? "cuda-ops" : "cuda-mk";
    o.n_kv_blocks = 256;
    o.kv_block_size = 16;
    cuda::CudaBackend be(dev, o);
    be.set_poison_activations(true);
    int n_checked = 0;
    for (const auto& seq : meta.at("sequences")) {
      const std::vector<int32_t> tokens = seq.at("tokens").get<std::vector<int32_t>>();
      const std::vector<int> positions = seq.at("positions").get<std::vector<int>>();
      const int n = static_cast<int>(tokens.size());
      ASSERT_EQ(positions.back(), n - 1) << "the golden file must hold each sequence's last position";
      const size_t offset = seq.at("offset").get<size_t>() + (positions.size() - 1) * static_cast<size_t>(V);
      ASSERT_LE(offset + V, golden.size());
      std::vector<int32_t> table(o.n_kv_blocks);
      std::iota(table.rbegin(), table.rend(), 0);  // blocks in descending order: not contiguous
      if (n > 1) be.prefill(SeqChunk{0, std::span(tokens).first(n - 1), 0, table}, {});
      DecodeSeq d;
      d.chunk = SeqChunk{0, std::span(tokens).subspan(n - 1, 1), n - 1, table};
      d.sampling.temperature = 0.0f;
      DecodeResult r;
      be.decode(std::span<const DecodeSeq>(&d, 1), true, r);
      const float* ref = golden.data() + offset;
      double max_ref = 0, max_err = 0;
      int ref_top = 0, ref_second = -1;
      for (int v = 0; v < V; ++v) {
        ASSERT_TRUE(std::isfinite(r.logits[v])) << be.name() << " logit " << v << " of a " << n << "-token sequence";
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[v])));
        max_err = std::max(max_err, std::fabs(static_cast<double>(r.logits[v]) - ref[v]));
        if (ref[v] > ref[ref_top]) ref_top = v;
      }
      for (int v = 0; v < V; ++v)
        if (v != ref_top && (ref_second < 0 || ref[v] > ref[ref_second])) ref_second = v;
      const double bound = 1e-2 * max_ref;
      std::printf("%s, %d tokens: max |err| %.3g (bound %.3g, max |ref| %.3g), token %d (transformers %d)\n",
                  be.name().c_str(), n, max_err, bound, max_ref, r.tokens[0], ref_top);
      EXPECT_LE(max_err, bound) << be.name() << ", " << n << "-token sequence";
      if (ref[ref_top] - ref[ref_second] > 2 * bound) EXPECT_EQ(r.tokens[0], ref_top) << be.name() << ", " << n << " tokens";
      ++n_checked;
    }
    EXPECT_GE(n_checked, 3);
  }
}

}  // namespace
}  // namespace megadecode::test
