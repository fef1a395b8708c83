// cuda-mk and cuda-ops against the external oracle, Hugging Face transformers' Qwen3MoeForCausalLM
// in fp32, routing-exact (routing_exact.h): the `small` preset written as a checkpoint with this
// run's seed (the GPU's synthetic weights for a seed are bit-identical to that checkpoint), random
// prompts of 1, 5, 37 and 300 tokens. Each sequence runs its prompt but the last token through
// prefill, then the last token as a decode step, with the device's routing captured;
// scripts/hf_reference.py --forced-routing then runs transformers on that routing and reports
// where its own top-k would have differed. Those differences must be near-ties of transformers'
// (bound kRouteNearTieMixed: fp32 against bf16 rounding points), and the step's logits within 1e-2 * max |ref| of transformers',
// the greedy token equal where the top-2 margin allows.
// MatchesTransformersOnNorthTiny does the same for cohere2_moe (North Mini Code) against
// Cohere2MoeForCausalLM: north-tiny written as a checkpoint and read back (cuda-mk, cpu-ref and
// transformers all run the checkpoint's bytes), prompts of 30-40 tokens past the 24-key sliding
// window (and one of 100-120 that wraps the KV ring twice) at batch 1 and 3, prompts through the
// megakernel (prefill_chunk 0) and the last token as one decode step of the batch. cuda-mk's
// captured routing (dense layer 0 recorded as expert -1, which the script leaves unrouted) is forced
// on transformers (near-tie bound kRouteNearTieMixed, rows within 1e-2 * max |ref|); then cpu-ref
// (fp32, as is) and its own routing, forced likewise: fp32 against fp32 with the same bf16 weights,
// so the same-rounding near-tie bound kRouteNearTie and rows within 1e-3 * max |ref|. A difference
// in the sliding window's semantics (megadecode attends the current key and the window - 1 before
// it, as transformers' sliding mask does), the parallel block, NoPE full layers, interleaved RoPE,
// sigmoid routing or logit_scale shows as a row over the bound.
// Needs python3 with torch and transformers (the GPU machine): MEGADECODE_HF_PYTHON names the
// interpreter (default python3), MEGADECODE_HF_SCRIPT the script (default: the source tree's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda/backend/cuda_backend.h"
#include "../gpu_test_util.h"
#include "kv/kv_cache.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "ref/ref_backend.h"
#include "../routing_exact.h"

namespace megadecode::test {
namespace {

namespace fs = std::filesystem;

struct DeviceRun {
  std::vector<std::vector<float>> logits;  // [sequence][vocab] of the last token
  std::vector<int32_t> tokens;             // greedy token of each sequence
  RoutingLog routing;
};

DeviceRun run_device(std::shared_ptr<const cuda::DeviceWeights> w, const ModelConfig& c, const std::string& backend,
                     const std::vector<std::vector<int32_t>>& prompts) {
  BackendOptions o;
  o.backend = backend;
  o.n_kv_blocks = 256;
  o.kv_block_size = 16;
  cuda::CudaBackend be(std::move(w), o);
  be.probe().set_poison_activations(true);
  DeviceRun out;
  out.routing = RoutingLog(c.n_layers, c.n_experts_per_tok);
  be.set_routing_capture(&out.routing);
  std::vector<int32_t> table(o.n_kv_blocks);
  std::iota(table.rbegin(), table.rend(), 0);  // blocks in descending order: not contiguous
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& t = prompts[i];
    const int n = static_cast<int>(t.size());
    const int64_t id = static_cast<int64_t>(i);
    if (n > 1) be.prefill(SeqChunk{id, std::span(t).first(n - 1), 0, table, {}}, {});
    DecodeSeq d;
    d.chunk = SeqChunk{id, std::span(t).subspan(n - 1, 1), n - 1, table, {}};
    d.sampling.temperature = 0.0f;
    DecodeResult r;
    be.decode(std::span<const DecodeSeq>(&d, 1), true, r);
    out.logits.push_back(r.logits);
    out.tokens.push_back(r.tokens[0]);
  }
  be.set_routing_capture(nullptr);
  return out;
}

// The routing file of scripts/hf_reference.py --forced-routing.
void write_routing(const fs::path& file, const ModelConfig& c, const std::vector<std::vector<int32_t>>& prompts,
                   const RoutingLog& routing) {
  nlohmann::json j;
  j["format"] = "megadecode-routing-v1";
  j["n_layers"] = c.n_layers;
  j["top_k"] = c.n_experts_per_tok;
  const int K = c.n_experts_per_tok;
  for (size_t i = 0; i < prompts.size(); ++i) {
    nlohmann::json experts = nlohmann::json::array();
    for (int pos = 0; pos < static_cast<int>(prompts[i].size()); ++pos) {
      const TokenRouting* t = routing.find(static_cast<int64_t>(i), pos);
      if (t == nullptr) throw std::runtime_error("no captured routing for sequence " + std::to_string(i) + " position " +
                                                 std::to_string(pos));
      nlohmann::json layers = nlohmann::json::array();
      for (int L = 0; L < c.n_layers; ++L)
        layers.push_back(std::vector<int32_t>(t->experts.begin() + L * K, t->experts.begin() + (L + 1) * K));
      experts.push_back(layers);
    }
    j["sequences"].push_back({{"tokens", prompts[i]}, {"experts", experts}});
  }
  std::ofstream(file) << j.dump() << "\n";
}

struct HfRun {
  std::vector<std::vector<float>> logits;  // [sequence][vocab] of the last position
  RoutingAudit audit;
  std::string model_type;  // transformers' config.model_type
};

HfRun run_transformers(const fs::path& model_dir, const fs::path& routing_file, const fs::path& prefix, int vocab) {
  const char* py = std::getenv("MEGADECODE_HF_PYTHON");
  const char* script = std::getenv("MEGADECODE_HF_SCRIPT");
  const std::string cmd = std::string(py ? py : "python3") + " " +
                          (script ? std::string(script) : std::string(MEGADECODE_SOURCE_DIR "/scripts/hf_reference.py")) +
                          " " + model_dir.string() + " --dtype float32 --forced-routing " + routing_file.string() +
                          " --out " + prefix.string() + " 2>&1 | tail -n 5";
  std::printf("%s\n", cmd.c_str());
  std::fflush(stdout);
  // The pipe hides the script's exit status: no output left from an earlier run may pass for this one's.
  fs::remove(prefix.string() + ".json");
  fs::remove(prefix.string() + ".f32");
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("transformers run failed: " + cmd);
  std::ifstream meta_in(prefix.string() + ".json");
  if (!meta_in) throw std::runtime_error("transformers wrote no " + prefix.string() + ".json (see its output above)");
  const nlohmann::json meta = nlohmann::json::parse(meta_in);
  if (meta.at("format") != "megadecode-hf-logits-v1" || meta.at("vocab_size") != vocab)
    throw std::runtime_error("unexpected transformers output metadata");
  std::vector<float> all(meta.at("n_floats").get<size_t>());
  std::ifstream f32(prefix.string() + ".f32", std::ios::binary);
  f32.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
  if (static_cast<size_t>(f32.gcount()) != all.size() * 4) throw std::runtime_error("short transformers logits file");
  HfRun out;
  out.model_type = meta.at("model_type").get<std::string>();
  for (const auto& seq : meta.at("sequences")) {
    const size_t at = seq.at("offset").get<size_t>() + (seq.at("positions").size() - 1) * static_cast<size_t>(vocab);
    out.logits.emplace_back(all.begin() + static_cast<int64_t>(at), all.begin() + static_cast<int64_t>(at + vocab));
    const auto& a = seq.at("routing_audit");
    out.audit.n_forced += a.at("n_forced").get<int64_t>();
    for (const auto& d : a.at("diffs"))
      out.audit.diffs.push_back(RouteDiff{static_cast<int64_t>(out.logits.size() - 1), d.at(0).get<int>(),
                                          d.at(1).get<int>(), d.at(2).get<double>()});
  }
  return out;
}

TEST(MegakernelHf, MatchesTransformersOnSmallPreset) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = seed_for("transformers vs cuda-mk/cuda-ops (weights and prompts)");
  SplitMix64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {1, 5, 37, 300}) {
    prompts.emplace_back(n);
    for (int32_t& t : prompts.back()) t = static_cast<int32_t>(rng.below(c.vocab_size));
  }
  const fs::path dir = fs::temp_directory_path() / ("megadecode-hf-" + std::to_string(seed));
  fs::create_directories(dir);
  write_synthetic_checkpoint(dir / "model", c, seed, size_t(4) << 30);
  std::ofstream(dir / "model" / "config.json") << model_config_to_json(c).dump(2) << "\n";

  std::shared_ptr<const cuda::DeviceWeights> w = cuda::DeviceWeights::synthetic(c, seed);
  const std::vector<std::string> backends =
      gpu_quick() ? std::vector<std::string>{"cuda-mk"} : std::vector<std::string>{"cuda-mk", "cuda-ops"};
  for (const std::string& backend : backends) {
    const DeviceRun dev = run_device(w, c, backend, prompts);
    write_routing(dir / "routing.json", c, prompts, dev.routing);
    const HfRun hf = run_transformers(dir / "model", dir / "routing.json", dir / "hf", c.vocab_size);
    int64_t n_tokens = 0;
    for (const auto& p : prompts) n_tokens += static_cast<int64_t>(p.size());
    expect_routing_exact(hf.audit, n_tokens * c.n_layers, kRouteNearTieMixed, backend + " vs transformers");
    ASSERT_EQ(hf.logits.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<float>& ref = hf.logits[i];
      const std::vector<float>& got = dev.logits[i];
      double max_ref = 0, max_err = 0;
      int ref_top = 0, ref_second = -1;
      for (int v = 0; v < c.vocab_size; ++v) {
        ASSERT_TRUE(std::isfinite(got[v])) << backend << " logit " << v << " of a " << prompts[i].size() << "-token sequence";
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[v])));
        max_err = std::max(max_err, std::fabs(static_cast<double>(got[v]) - ref[v]));
        if (ref[v] > ref[ref_top]) ref_top = v;
      }
      for (int v = 0; v < c.vocab_size; ++v)
        if (v != ref_top && (ref_second < 0 || ref[v] > ref[ref_second])) ref_second = v;
      const double bound = 1e-2 * max_ref;
      std::printf("%s, %zu tokens: max |err| %.3g (bound %.3g, max |ref| %.3g), token %d (transformers %d)\n",
                  backend.c_str(), prompts[i].size(), max_err, bound, max_ref, dev.tokens[i], ref_top);
      EXPECT_LE(max_err, bound) << backend << ", " << prompts[i].size() << "-token sequence";
      if (ref[ref_top] - ref[ref_second] > 2 * bound)
        EXPECT_EQ(dev.tokens[i], ref_top) << backend << ", " << prompts[i].size() << " tokens";
    }
  }
  fs::remove_all(dir);
}


// ---- cohere2_moe (north-tiny) ----

constexpr int kNorthBlock = 16;

// Prompts through prefill (all but the last token; cohere2_moe's prefill runs through the decode
// path, prefill_chunk 0), then the last tokens as one decode step of the whole batch, over a KvCache
// with the sliding layers' ring pool. Sequence ids 0..n-1 (write_routing's). Rows: each sequence's
// last position.
struct NorthRun {
  std::vector<std::vector<float>> logits;  // [sequence][vocab]
  std::vector<int32_t> tokens;             // greedy token of each sequence
  RoutingLog routing;
};

struct NorthPools {
  int n_full = 0, n_ring = 0, ring_len = 0;
};

NorthPools north_pools(const ModelConfig& c, const std::vector<std::vector<int32_t>>& prompts) {
  NorthPools p;
  p.ring_len = kv_ring_length(c.max_sliding_window(), kNorthBlock);
  for (const auto& t : prompts) p.n_full += (static_cast<int>(t.size()) + kNorthBlock - 1) / kNorthBlock;
  p.n_full += 3;
  p.n_ring = static_cast<int>(prompts.size()) * p.ring_len + 1;
  return p;
}

BackendOptions north_options(const NorthPools& p, const std::string& backend) {
  BackendOptions o{.backend = backend, .kv_block_size = kNorthBlock, .n_kv_blocks = p.n_full};
  o.n_ring_blocks = p.n_ring;
  o.prefill_chunk = 0;  // cohere2_moe's prompts go through the megakernel (the prefill kernels refuse it)
  return o;
}

void run_north(Backend& be, const ModelConfig& c, const NorthPools& p, const std::vector<std::vector<int32_t>>& prompts,
               NorthRun& out) {
  KvCache cache(p.n_full, kNorthBlock, false, p.n_ring, p.ring_len);
  const int n = static_cast<int>(prompts.size());
  for (int s = 0; s < n; ++s) {
    const std::vector<int32_t>& t = prompts[s];
    const int len = static_cast<int>(t.size());
    ASSERT_GE(len, 2);
    cache.admit(s, cache.plan_admission(t, 0, 1));
    ASSERT_TRUE(cache.ensure(s, len));
    be.prefill(SeqChunk{s, std::span(t).first(len - 1), 0, cache.table(s), cache.ring_table(s)}, {});
  }
  std::vector<DecodeSeq> batch(n);
  for (int s = 0; s < n; ++s) {
    const std::vector<int32_t>& t = prompts[s];
    const int len = static_cast<int>(t.size());
    batch[s].chunk = SeqChunk{s, std::span(t).subspan(len - 1, 1), len - 1, cache.table(s), cache.ring_table(s)};
    batch[s].sampling.temperature = 0.0f;
  }
  DecodeResult r;
  be.decode(batch, true, r);
  const size_t V = c.vocab_size;
  ASSERT_EQ(r.logits.size(), n * V);
  ASSERT_EQ(r.tokens.size(), static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    out.logits.emplace_back(r.logits.begin() + s * V, r.logits.begin() + (s + 1) * V);
    out.tokens.push_back(r.tokens[s]);
  }
}

// `what`'s rows and routing against transformers run on that routing: the routing audit (every
// sparse (token, layer) forced; differences only at near-ties below `near_tie`), then every row
// within tol * max |ref|, the greedy token equal where the reference's top-2 margin allows.
void expect_matches_transformers(const fs::path& dir, const ModelConfig& c,
                                 const std::vector<std::vector<int32_t>>& prompts, const NorthRun& run,
                                 double near_tie, double tol, const std::string& what) {
  int64_t n_tokens = 0;
  for (const auto& p : prompts) n_tokens += static_cast<int64_t>(p.size());
  ASSERT_EQ(static_cast<int64_t>(run.routing.size()), n_tokens) << what << ": the routing of every token";
  // Dense layers carry no routing: the capture records them as expert -1 (the script requires it).
  for (const auto& [key, tr] : run.routing.tokens())
    for (int L = 0; L < c.n_layers; ++L)
      for (int k = 0; k < c.n_experts_per_tok; ++k) {
        const int32_t e = tr.experts[static_cast<size_t>(L) * c.n_experts_per_tok + k];
        if (c.is_moe_layer(L)) ASSERT_TRUE(e >= 0 && e < c.n_experts) << what << " layer " << L << " expert " << e;
        else ASSERT_EQ(e, -1) << what << ": dense layer " << L << " of seq " << key.first << " pos " << key.second;
      }
  int moe_layers = 0;
  for (int L = 0; L < c.n_layers; ++L) moe_layers += c.is_moe_layer(L);
  write_routing(dir / "routing.json", c, prompts, run.routing);
  const HfRun hf = run_transformers(dir / "model", dir / "routing.json", dir / "hf", c.vocab_size);
  EXPECT_EQ(hf.model_type, "cohere2_moe") << what;
  expect_routing_exact(hf.audit, n_tokens * moe_layers, near_tie, what + " vs transformers");
  ASSERT_EQ(hf.logits.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<float>& ref = hf.logits[i];
    const std::vector<float>& got = run.logits[i];
    double max_ref = 0, max_err = 0;
    int ref_top = 0, ref_second = -1;
    for (int v = 0; v < c.vocab_size; ++v) {
      ASSERT_TRUE(std::isfinite(got[v])) << what << " logit " << v << " of a " << prompts[i].size() << "-token sequence";
      ASSERT_TRUE(std::isfinite(ref[v])) << "transformers logit " << v << " of a " << prompts[i].size()
                                         << "-token sequence";
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[v])));
      max_err = std::max(max_err, std::fabs(static_cast<double>(got[v]) - ref[v]));
      if (ref[v] > ref[ref_top]) ref_top = v;
    }
    for (int v = 0; v < c.vocab_size; ++v)
      if (v != ref_top && (ref_second < 0 || ref[v] > ref[ref_second])) ref_second = v;
    const double bound = tol * max_ref;
    std::printf("%s, sequence %zu (%zu tokens): max |err| %.3g (bound %.3g, max |ref| %.3g), token %d (transformers %d)\n",
                what.c_str(), i, prompts[i].size(), max_err, bound, max_ref, run.tokens[i], ref_top);
    EXPECT_LE(max_err, bound) << what << ", sequence " << i << " (" << prompts[i].size() << " tokens)";
    if (ref[ref_top] - ref[ref_second] > 2 * bound)
      EXPECT_EQ(run.tokens[i], ref_top) << what << ", sequence " << i << " (" << prompts[i].size() << " tokens)";
  }
}

TEST(MegakernelHf, MatchesTransformersOnNorthTiny) {
  MD_REQUIRE_GPU();
  const uint64_t seed = seed_for("transformers vs cuda-mk/cpu-ref on north-tiny (weights and prompts)");
  SplitMix64 rng(seed);
  const fs::path dir = fs::temp_directory_path() / ("megadecode-hf-north-" + std::to_string(seed));
  fs::create_directories(dir);
  {
    const ModelConfig preset = preset_config("north-tiny");
    write_synthetic_checkpoint(dir / "model", preset, seed, size_t(4) << 30);
    std::ofstream(dir / "model" / "config.json") << model_config_to_json(preset).dump(2) << "\n";
  }
  // The checkpoint as written: its config.json parsed back, its bf16 tensors on every side.
  auto host = std::make_shared<LoadedModel>(load_model(dir / "model"));
  const ModelConfig& c = host->config;
  ASSERT_EQ(c.model_type, "cohere2_moe");
  ASSERT_EQ(c.block, BlockKind::kParallel);
  ASSERT_EQ(c.router, RouterKind::kSigmoidTopK);
  ASSERT_FALSE(c.norm_topk_prob);
  ASSERT_NE(c.logit_scale, 1.0f);
  ASSERT_EQ(c.layers[0].ffn, FfnKind::kDense);
  ASSERT_EQ(c.max_sliding_window(), 24);
  std::shared_ptr<const cuda::DeviceWeights> dev = cuda::DeviceWeights::upload(c, host->weights);

  for (int batch : {1, 3}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int s = 0; s < batch; ++s) {
      // Past the 24-key window; the third sequence of the batch also wraps the 48-slot ring twice.
      const int n = s == 2 ? 100 + static_cast<int>(rng.below(21)) : 30 + static_cast<int>(rng.below(11));
      prompts.emplace_back(n);
      for (int32_t& t : prompts.back()) t = static_cast<int32_t>(rng.below(c.vocab_size));
    }
    const NorthPools pools = north_pools(c, prompts);
    const std::string tag = " batch " + std::to_string(batch);
    {
      cuda::CudaBackend be(dev, north_options(pools, "cuda-mk"));
      be.probe().set_poison_activations(true);
      NorthRun run;
      run.routing = RoutingLog(c.n_layers, c.n_experts_per_tok);
      be.set_routing_capture(&run.routing);
      run_north(be, c, pools, prompts, run);
      be.set_routing_capture(nullptr);
      if (HasFatalFailure()) return;
      EXPECT_EQ(be.probe().check_counter_totals(), "") << "cuda-mk" << tag;
      expect_matches_transformers(dir, c, prompts, run, kRouteNearTieMixed, 1e-2, "cuda-mk" + tag);
    }
    {
      BackendOptions o = north_options(pools, "cpu-ref");
      o.n_threads = 4;
      ref::RefBackend ref(c, host->weights, host, o);
      ref.kv_store().fill(NAN);
      NorthRun run;
      run.routing = RoutingLog(c.n_layers, c.n_experts_per_tok);
      ref.set_routing_record(&run.routing);
      run_north(ref, c, pools, prompts, run);
      if (HasFatalFailure()) return;
      expect_matches_transformers(dir, c, prompts, run, kRouteNearTie, 1e-3, "cpu-ref" + tag);
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megadecode::test
