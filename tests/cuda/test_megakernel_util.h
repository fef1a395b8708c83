// Shared setup of the megakernel GPU tests: random ragged batches over a shuffled paged KV cache
// whose history is random bf16 (identical on host and device) and whose every other slot holds
// large noise, a decode step on a CUDA backend, and the routing-exact comparison against cpu-ref
// (routing_exact.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/rng.h"
#include "cuda/backend/cuda_backend.h"
#include "gpu_test_util.h"
#include "model/loader.h"
#include "model/presets.h"
#include "routing_exact.h"

namespace megadecode::test {

// The `small` preset (full widths, 128 experts, 2 layers) with weights of the test's seed, on the
// host and on the device, made once per test binary.
struct Small {
  ModelConfig config;
  uint64_t seed;
  LoadedModel host;
  std::shared_ptr<cuda::DeviceWeights> dev;
};

inline Small& small() {
  static Small* s = [] {
    auto* x = new Small;
    x->config = preset_config("small");
    x->seed = test_seed();
    std::printf("small preset, weight seed %llu (MEGADECODE_SEED reproduces)\n",
                static_cast<unsigned long long>(x->seed));
    x->host = synthetic_model(x->config, x->seed);
    x->dev = cuda::DeviceWeights::synthetic(x->config, x->seed);
    return x;
  }();
  return *s;
}

// One sequence of a case: its new token at position n_ctx - 1 over the KV history in `table`.
struct CaseSeq {
  int32_t token;
  int n_ctx;
  std::vector<int32_t> table;  // physical KV blocks
};

struct Case {
  std::vector<CaseSeq> seqs;
  std::vector<uint16_t> kv;  // host copy of the whole device cache
  std::vector<SamplingParams> sampling;
};

// Contexts uniform in [1, max_ctx] (plus the forced ones), blocks a random permutation.
inline Case make_case(const ModelConfig& c, const cuda::CudaBackend& be, SplitMix64& rng, int batch, int max_ctx,
                      std::vector<int> forced_ctx = {}) {
  Case k;
  const int bs = be.kv_block_size(), nb = be.n_kv_blocks();
  std::vector<int32_t> perm(nb);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = nb - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  int next = 0;
  for (int i = 0; i < batch; ++i) {
    CaseSeq s;
    s.n_ctx = i < static_cast<int>(forced_ctx.size()) ? forced_ctx[i] : 1 + static_cast<int>(rng.below(max_ctx));
    s.token = static_cast<int32_t>(rng.below(c.vocab_size));
    const int blocks = (s.n_ctx + bs - 1) / bs;
    if (next + blocks > nb) throw std::runtime_error("test KV cache too small");
    s.table.assign(perm.begin() + next, perm.begin() + next + blocks);
    next += blocks;
    k.seqs.push_back(s);
    SamplingParams sp;
    sp.temperature = 0.0f;
    k.sampling.push_back(sp);
  }
  k.kv.resize(be.kv_cache_elements());
  for (auto& x : k.kv) x = float_to_bf16_bits((rng.unit() < 0.5f ? -1.0f : 1.0f) * (1000.0f + 30000.0f * rng.unit()));
  const int G = c.n_kv_heads, D = c.head_dim;
  // The full pool's layers (engine/kv_pools.h: every layer for qwen3_moe, whose full index is the layer).
  const int n_pool_layers = static_cast<int>(k.kv.size() / (size_t{2} * nb * G * bs * D));
  if (n_pool_layers != c.n_layers - c.n_sliding_layers()) throw std::runtime_error("full KV pool of an unexpected size");
  for (const CaseSeq& s : k.seqs)
    for (int L = 0; L < n_pool_layers; ++L)
      for (int kvi = 0; kvi < 2; ++kvi)
        for (int j = 0; j + 1 < s.n_ctx; ++j)
          for (int g = 0; g < G; ++g)
            for (int d = 0; d < D; ++d) {
              const int64_t i = ((((static_cast<int64_t>(L) * 2 + kvi) * nb + s.table[j / bs]) * G + g) * bs + j % bs) * D + d;
              k.kv[i] = float_to_bf16_bits(1.7f * (2.0f * rng.unit() - 1.0f));
            }
  return k;
}

// The decode step of a case, one DecodeSeq per sequence (views into `k`).
inline std::vector<DecodeSeq> decode_seqs(const Case& k) {
  std::vector<DecodeSeq> ds(k.seqs.size());
  for (size_t i = 0; i < k.seqs.size(); ++i) {
    ds[i].chunk.seq_id = static_cast<int64_t>(i);
    ds[i].chunk.tokens = std::span<const int32_t>(&k.seqs[i].token, 1);
    ds[i].chunk.start_pos = k.seqs[i].n_ctx - 1;
    ds[i].chunk.block_table = k.seqs[i].table;
    ds[i].sampling = k.sampling[i];
  }
  return ds;
}

// The case's decode step on `be`; with `routing`, the device's routing of it (captured).
inline std::vector<float> run_case(cuda::CudaBackend& be, const Case& k, std::vector<int32_t>* tokens = nullptr,
                                   RoutingLog* routing = nullptr) {
  if (cudaMemcpy(be.kv_cache(), k.kv.data(), k.kv.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess)
    throw std::runtime_error("KV upload failed");
  const std::vector<DecodeSeq> ds = decode_seqs(k);
  DecodeResult r;
  if (routing) {
    *routing = RoutingLog(be.config().n_layers, be.config().n_experts_per_tok);
    be.set_routing_capture(routing);
  }
  be.decode(ds, true, r);
  be.set_routing_capture(nullptr);
  if (tokens) *tokens = r.tokens;
  return r.logits;
}

// cpu-ref's decode of the case's step (the device-layout bf16 KV history copied into its fp32
// store, everything else poisoned with NaN), its routing forced to `forced` and audited into
// `audit`; `device_rounding` selects the reference's rounding points (ref/ref_model.h).
inline std::vector<std::vector<float>> cpu_ref_step(const ModelConfig& c, const ModelWeights& w, const Case& k,
                                                    int device_blocks, const RoutingLog& forced, bool device_rounding,
                                                    RoutingAudit& audit) {
  const int bs = 16, G = c.n_kv_heads, D = c.head_dim;
  if (c.n_sliding_layers() != 0) throw std::runtime_error("cpu_ref_step copies a full pool of every layer");
  int n_blocks = 0;  // only the blocks the case uses: the store is fp32, the device cache may be large
  for (const CaseSeq& s : k.seqs)
    for (int32_t b : s.table) n_blocks = std::max(n_blocks, b + 1);
  BackendOptions o;
  o.kv_block_size = bs;
  o.n_kv_blocks = std::max(n_blocks, 1);
  ref::RefBackend be(c, w, nullptr, o);
  be.kv_store().fill(std::nanf(""));  // anything the step reads must come from the history below
  for (const CaseSeq& s : k.seqs)
    for (int j = 0; j + 1 < s.n_ctx; ++j) {
      const ref::KvStore::Slot slot = be.kv_store().locate(s.table, j);
      for (int L = 0; L < c.n_layers; ++L)
        for (int kvi = 0; kvi < 2; ++kvi) {
          float* dst = kvi == 0 ? be.kv_store().key(L, slot) : be.kv_store().value(L, slot);
          for (int g = 0; g < G; ++g)
            for (int d = 0; d < D; ++d) {
              const int64_t i = ((((static_cast<int64_t>(L) * 2 + kvi) * device_blocks + s.table[j / bs]) * G + g) * bs +
                                 j % bs) * D + d;
              dst[g * D + d] = bf16_bits_to_float(k.kv[i]);
            }
        }
    }
  be.set_device_rounding(device_rounding);
  be.set_forced_routing(&forced, &audit);
  const std::vector<DecodeSeq> ds = decode_seqs(k);
  DecodeResult r;
  be.decode(ds, true, r);
  std::vector<std::vector<float>> out(k.seqs.size());
  const size_t V = static_cast<size_t>(c.vocab_size);
  for (size_t i = 0; i < out.size(); ++i) out[i].assign(r.logits.begin() + i * V, r.logits.begin() + (i + 1) * V);
  return out;
}

struct Compare {
  double max_err = 0, max_ref = 0;
  int n_bad = 0, n_nan = 0, token_mismatch = 0;
  std::vector<int> bad_seqs;  // sequences over the bound, for the per-sequence report
};

// Per sequence: max |dev - ref| <= tol * max |ref|; greedy tokens equal where the reference's top-2
// margin exceeds the bound.
inline Compare compare(const std::vector<float>& dev, const std::vector<std::vector<float>>& ref,
                       const std::vector<int32_t>& tokens, int vocab, double tol) {
  Compare out;
  for (size_t s = 0; s < ref.size(); ++s) {
    double err = 0, mref = 0;
    int best = 0, second = -1;
    for (int v = 0; v < vocab; ++v) {
      const float d = dev[s * vocab + v], r = ref[s][v];
      if (!std::isfinite(d)) ++out.n_nan;
      err = std::max(err, std::fabs(static_cast<double>(d) - r));
      mref = std::max(mref, std::fabs(static_cast<double>(r)));
      if (r > ref[s][best]) best = v;
    }
    for (int v = 0; v < vocab; ++v)
      if (v != best && (second < 0 || ref[s][v] > ref[s][second])) second = v;
    if (err > tol * mref) {
      ++out.n_bad;
      out.bad_seqs.push_back(static_cast<int>(s));
    }
    const double bound = tol * mref;
    if (second >= 0 && ref[s][best] - ref[s][second] > 2 * bound && tokens[s] != best) ++out.token_mismatch;
    out.max_err = std::max(out.max_err, err / std::max(mref, 1e-30));
    out.max_ref = std::max(out.max_ref, mref);
  }
  return out;
}

}  // namespace megadecode::test
