// GPU prefill kernels (src/cuda/prefill) through CudaBackend::prefill on the `small` preset (full
// widths, 128 experts, 2 layers), synthetic weights identical on host and device:
//  - against cpu-ref, routing-exact (routing_exact.h: cpu-ref with the device's rounding points
//    runs on the routing the device chose; near-tie bound kRouteNearTieMixed, since the prefill
//    attention takes q and P in bf16 where the reference keeps fp32): prompts of 1, 17, 255,
//    1000, 2500 tokens, pieces of 512, each prompt sent as two calls (the second continuing at
//    start_pos > 0) over a shuffled block table in a NaN-poisoned cache: last-token logits within
//    1e-2 * max |ref|, every written K/V element of every layer and position near the reference,
//    nothing written outside the prompt's slots, and a decode step after the prefill matching;
//  - against the one-token decode path (prefill_chunk = 0) on the device: layer-0 K/V within bf16
//    rounding, logits within 1e-2;
//  - bitwise invariance to the piece size and to how the prompt is split into calls, and
//    determinism (the same prefill twice);
//  - Errors for bad tokens and block tables;
//  - mixed steps (cuda-batched: prompt pieces riding in decode steps): the prompt routing-exact
//    against cpu-ref (last-token logits, every K/V element, a decode step after), and the decode
//    rows' tokens and logits bitwise those of the same step without the pieces.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/backend/cuda_backend.h"
#include "../gpu_test_util.h"
#include "model/loader.h"
#include "model/presets.h"
#include "ref/ref_backend.h"
#include "../routing_exact.h"

namespace megadecode::test {
namespace {

constexpr int kBlocks = 640;
constexpr int kBs = 16;

struct Prompt {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;  // covers tokens.size() + 1 positions (room for one decode step)
};

Prompt make_prompt(const ModelConfig& c, SplitMix64& rng, int n) {
  Prompt p;
  for (int i = 0; i < n; ++i) p.tokens.push_back(static_cast<int32_t>(rng.below(c.vocab_size)));
  std::vector<int32_t> perm(kBlocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = kBlocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  perm.resize((n + 1 + kBs - 1) / kBs);
  p.table = perm;
  return p;
}

std::shared_ptr<const cuda::DeviceWeights> device_weights(const ModelConfig& c, uint64_t seed) {
  return cuda::DeviceWeights::synthetic(c, seed);
}

std::unique_ptr<cuda::CudaBackend> make_backend(std::shared_ptr<const cuda::DeviceWeights> w, int chunk, bool per_op) {
  BackendOptions o;
  o.backend = "cuda-mk";
  o.n_kv_blocks = kBlocks;
  o.kv_block_size = kBs;
  o.prefill_chunk = chunk;
  o.backend = per_op ? "cuda-ops" : "cuda-mk";
  return std::make_unique<cuda::CudaBackend>(std::move(w), o);
}

void poison_kv(const cuda::CudaBackend& be) { CUDA_CHECK(cudaMemset(be.kv_cache(), 0xff, be.kv_cache_elements() * 2)); }

std::vector<uint16_t> read_kv(const cuda::CudaBackend& be) {
  std::vector<uint16_t> kv(be.kv_cache_elements());
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(kv.data(), be.kv_cache(), kv.size() * 2, cudaMemcpyDeviceToHost));
  return kv;
}

// The prompt as two calls split at `split` (0: one call); logits of the last token.
std::vector<float> run_prefill(Backend& be, const ModelConfig& c, const Prompt& p, int split) {
  std::vector<float> logits(c.vocab_size, std::nanf(""));
  const int n = static_cast<int>(p.tokens.size());
  SeqChunk a;
  a.block_table = p.table;
  if (split > 0 && split < n) {
    a.tokens = std::span<const int32_t>(p.tokens).first(split);
    a.start_pos = 0;
    be.prefill(a, {});
  } else {
    split = 0;
  }
  a.tokens = std::span<const int32_t>(p.tokens).subspan(split);
  a.start_pos = split;
  be.prefill(a, logits);
  return logits;
}

std::vector<float> decode_after(Backend& be, const Prompt& p, int32_t token) {
  DecodeSeq s;
  s.chunk.tokens = std::span<const int32_t>(&token, 1);
  s.chunk.start_pos = static_cast<int>(p.tokens.size());
  s.chunk.block_table = p.table;
  s.sampling.temperature = 0.0f;
  DecodeResult r;
  be.decode(std::span<const DecodeSeq>(&s, 1), true, r);
  return r.logits;
}

int64_t kv_index(const ModelConfig& c, int layer, int kv, int block, int g, int slot, int d) {
  return ((((static_cast<int64_t>(layer) * 2 + kv) * kBlocks + block) * c.n_kv_heads + g) * kBs + slot) * c.head_dim + d;
}

struct KvCompare {
  double worst_ratio[2] = {0, 0};  // max over elements of |dev - ref| / bound: layer 0, later layers
  double max_err[2] = {0, 0};      // max |dev - ref| / max |ref|: layer 0, later layers
  int n_nan = 0;
  int bad_positions = 0;  // positions with an element over the bound in any layer
};

// Every position of the prompt, every layer, K and V: |dev - ref| <= 2^-7 |ref| + atol * max |ref|
// (per layer and K/V; atol_layer0 for layer 0, atol for the later ones, whose inputs went through
// more rounding). The reference ran on the device's routing, so every element must pass.
KvCompare compare_kv(const ModelConfig& c, const std::vector<uint16_t>& dev, ref::RefBackend& ref, const Prompt& p,
                     double atol_layer0, double atol) {
  KvCompare out;
  const int n = static_cast<int>(p.tokens.size()), G = c.n_kv_heads, D = c.head_dim;
  std::vector<char> bad(n, 0);
  for (int L = 0; L < c.n_layers; ++L)
    for (int kv = 0; kv < 2; ++kv) {
      double mref = 0;
      for (int pos = 0; pos < n; ++pos) {
        const ref::KvStore::Slot s = ref.kv_store().locate(p.table, pos);
        const float* r = kv == 0 ? ref.kv_store().key(L, s) : ref.kv_store().value(L, s);
        for (int i = 0; i < G * D; ++i) mref = std::max(mref, std::fabs(static_cast<double>(r[i])));
      }
      const double a = (L == 0 ? atol_layer0 : atol) * mref;
      for (int pos = 0; pos < n; ++pos) {
        const ref::KvStore::Slot s = ref.kv_store().locate(p.table, pos);
        const float* r = kv == 0 ? ref.kv_store().key(L, s) : ref.kv_store().value(L, s);
        for (int g = 0; g < G; ++g)
          for (int d = 0; d < D; ++d) {
            const float x = bf16_bits_to_float(dev[kv_index(c, L, kv, s.block, g, s.slot, d)]);
            const double rv = r[g * D + d];
            if (!std::isfinite(x)) {
              ++out.n_nan;
              continue;
            }
            const double e = std::fabs(x - rv);
            out.max_err[L == 0 ? 0 : 1] = std::max(out.max_err[L == 0 ? 0 : 1], e / std::max(mref, 1e-30));
            const double ratio = e / (std::ldexp(std::fabs(rv), -7) + a);
            out.worst_ratio[L == 0 ? 0 : 1] = std::max(out.worst_ratio[L == 0 ? 0 : 1], ratio);
            if (ratio > 1.0) bad[pos] = 1;
          }
      }
    }
  for (char b : bad) out.bad_positions += b;
  return out;
}

// Elements outside the prompt's (block, slot) positions that are no longer the 0xffff poison.
int64_t stray_writes(const ModelConfig& c, const std::vector<uint16_t>& dev, const Prompt& p, int n_written) {
  std::vector<char> mine(static_cast<size_t>(kBlocks) * kBs, 0);
  for (int pos = 0; pos < n_written; ++pos) mine[static_cast<size_t>(p.table[pos / kBs]) * kBs + pos % kBs] = 1;
  int64_t bad = 0;
  for (int L = 0; L < c.n_layers; ++L)
    for (int kv = 0; kv < 2; ++kv)
      for (int b = 0; b < kBlocks; ++b)
        for (int g = 0; g < c.n_kv_heads; ++g)
          for (int slot = 0; slot < kBs; ++slot) {
            if (mine[static_cast<size_t>(b) * kBs + slot]) continue;
            for (int d = 0; d < c.head_dim; ++d) bad += dev[kv_index(c, L, kv, b, g, slot, d)] != 0xffff;
          }
  return bad;
}

struct LogitCompare {
  double rel = 0;  // max |dev - ref| / max |ref|
  int n_nan = 0;
};
LogitCompare compare_logits(const std::vector<float>& dev, const std::vector<float>& ref) {
  LogitCompare out;
  double err = 0, mref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(dev[i])) {
      ++out.n_nan;
      continue;
    }
    err = std::max(err, std::fabs(static_cast<double>(dev[i]) - ref[i]));
    mref = std::max(mref, std::fabs(static_cast<double>(ref[i])));
  }
  out.rel = err / std::max(mref, 1e-30);
  return out;
}

// cpu-ref over the same cache geometry, its KV poisoned (NaN), rounding where the device rounds.
std::unique_ptr<ref::RefBackend> make_ref(const ModelConfig& c, const LoadedModel& host) {
  BackendOptions ro;
  ro.kv_block_size = kBs;
  ro.n_kv_blocks = kBlocks;
  auto ref = std::make_unique<ref::RefBackend>(c, host.weights, nullptr, ro);
  ref->kv_store().fill(std::nanf(""));
  ref->set_device_rounding(true);
  return ref;
}

TEST(Prefill, MatchesCpuRefOnSmallPreset) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = seed_for("prefill vs cpu-ref (weights and prompts)");
  const LoadedModel host = synthetic_model(c, seed);
  auto be = make_backend(device_weights(c, seed), 512, false);
  SplitMix64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const std::vector<int> lengths = gpu_quick() ? std::vector<int>{17, 1000} : std::vector<int>{1, 17, 255, 1000, 2500};
  for (int n : lengths) {
    const Prompt p = make_prompt(c, rng, n);
    const int split = n > 1 ? 1 + static_cast<int>(rng.below(n - 1)) : 0;
    const std::unique_ptr<ref::RefBackend> ref_owner = make_ref(c, host);
    ref::RefBackend& ref = *ref_owner;
    poison_kv(*be);
    RoutingLog routing(c.n_layers, c.n_experts_per_tok);
    be->set_routing_capture(&routing);
    const std::vector<float> dev = run_prefill(*be, c, p, split);
    const int32_t next = static_cast<int32_t>(rng.below(c.vocab_size));
    const std::vector<float> dev_next = decode_after(*be, p, next);
    be->set_routing_capture(nullptr);
    RoutingAudit audit;
    ref.set_forced_routing(&routing, &audit);
    const std::vector<float> want = run_prefill(ref, c, p, 0);
    const std::vector<uint16_t> kv = read_kv(*be);
    const KvCompare kc = compare_kv(c, kv, ref, p, 5e-3, 2e-2);
    const LogitCompare lc = compare_logits(dev, want);
    const int64_t stray = stray_writes(c, kv, p, n + 1);  // the decode step wrote position n
    const LogitCompare dc = compare_logits(dev_next, decode_after(ref, p, next));
    expect_routing_exact(audit, static_cast<int64_t>(n + 1) * c.n_layers, kRouteNearTieMixed,
                         "prompt " + std::to_string(n) + " + 1 decode step");
    std::printf("prompt %4d (split at %4d): logits %.3g of max |ref|; K/V max err / max |ref| layer 0 %.3g, later "
                "layers %.3g (worst %.2f / %.2f of the bound, %d positions over it); decode after: %.3g\n",
                n, split, lc.rel, kc.max_err[0], kc.max_err[1], kc.worst_ratio[0], kc.worst_ratio[1], kc.bad_positions,
                dc.rel);
    EXPECT_EQ(lc.n_nan, 0) << "prompt " << n << ": NaN logits";
    EXPECT_LE(lc.rel, 1e-2) << "prompt " << n;
    EXPECT_EQ(kc.n_nan, 0) << "prompt " << n << ": unwritten (NaN) K/V inside the prompt";
    EXPECT_EQ(kc.bad_positions, 0) << "prompt " << n << ": positions whose K/V is off";
    EXPECT_EQ(stray, 0) << "prompt " << n << ": K/V written outside the prompt's slots";
    EXPECT_EQ(dc.n_nan, 0) << "prompt " << n << ": NaN logits in the decode step";
    EXPECT_LE(dc.rel, 1e-2) << "prompt " << n << ": decode after prefill";
  }
}

// Mixed steps: a prompt in random pieces riding in decode steps of three streams (cuda-batched),
// routing-exact against cpu-ref; each step's decode rows bitwise equal to the step rerun alone.
// Small pieces past a few hundred positions split their attention's keys (up to 6 splits here).
TEST(Prefill, MixedStepsMatchCpuRefAndKeepDecodeRowsBitwise) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = seed_for("mixed steps vs cpu-ref and the plain step");
  const LoadedModel host = synthetic_model(c, seed);
  BackendOptions o;
  o.backend = "cuda-batched";
  o.n_kv_blocks = kBlocks;
  o.kv_block_size = kBs;
  o.prefill_chunk = 512;
  o.max_batch = 8;
  cuda::CudaBackend be(device_weights(c, seed), o);
  be.probe().set_poison_activations(true);
  ASSERT_EQ(be.max_mixed_prompt_rows(), 512) << "the prefill chunk bounds a mixed step's prompt rows";
  SplitMix64 rng(seed ^ 0x51ed27a1c0ffee11ull);
  const int n = gpu_quick() ? 1500 : 2500;
  // Blocks: the prompt's first, then each stream's (disjoint, shuffled).
  std::vector<int32_t> perm(kBlocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = kBlocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  Prompt p;
  for (int i = 0; i < n; ++i) p.tokens.push_back(static_cast<int32_t>(rng.below(c.vocab_size)));
  const int pb = (n + 1 + kBs - 1) / kBs;
  p.table.assign(perm.begin(), perm.begin() + pb);
  p.table.resize(pb);
  constexpr int kStreams = 3;
  std::vector<Prompt> streams(kStreams);
  int next_block = pb;
  for (int s = 0; s < kStreams; ++s) {
    for (int i = 0, len = 20 + static_cast<int>(rng.below(300)); i < len; ++i)
      streams[s].tokens.push_back(static_cast<int32_t>(rng.below(c.vocab_size)));
    const int nb = (static_cast<int>(streams[s].tokens.size()) + 64 + kBs - 1) / kBs;  // room for the steps
    streams[s].table.assign(perm.begin() + next_block, perm.begin() + next_block + nb);
    next_block += nb;
  }
  ASSERT_LE(next_block, kBlocks);
  poison_kv(be);
  const std::unique_ptr<ref::RefBackend> ref_owner = make_ref(c, host);
  ref::RefBackend& ref = *ref_owner;
  RoutingLog routing(c.n_layers, c.n_experts_per_tok);
  be.set_routing_capture(&routing);
  // The streams' prompts (but their last tokens) as plain prefill calls, sequence ids 1..3.
  std::vector<int> pos(kStreams);
  std::vector<int32_t> next(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    SeqChunk a{s + 1, std::span<const int32_t>(streams[s].tokens).first(streams[s].tokens.size() - 1), 0,
               streams[s].table, {}};
    be.prefill(a, {});
    pos[s] = static_cast<int>(streams[s].tokens.size()) - 1;
    next[s] = streams[s].tokens.back();
  }
  const size_t V = static_cast<size_t>(c.vocab_size);
  int done = 0, steps = 0;
  while (done < n) {
    // Half the pieces small (a long position's few tokens split their keys: attn_key_splits).
    const int piece = std::min(n - done, 1 + static_cast<int>(rng.below(rng.below(2) == 0 ? 24 : 400)));
    // A third of the steps cut it in two pieces (the second attends to the first's keys of the same step).
    const int cut = piece > 1 && rng.below(3) == 0 ? 1 + static_cast<int>(rng.below(piece - 1)) : piece;
    const std::span<const int32_t> toks = std::span<const int32_t>(p.tokens).subspan(done, piece);
    const SeqChunk chunks[2] = {SeqChunk{0, toks.first(cut), done, p.table, {}},
                                SeqChunk{0, toks.subspan(cut), done + cut, p.table, {}}};
    std::vector<DecodeSeq> rows(kStreams);
    for (int s = 0; s < kStreams; ++s) {
      rows[s].chunk = SeqChunk{s + 1, std::span<const int32_t>(&next[s], 1), pos[s], streams[s].table, {}};
      rows[s].sampling.temperature = 0.0f;
    }
    DecodeResult mixed, plain;
    be.decode_mixed(std::span<const SeqChunk>(chunks, cut < piece ? 2 : 1), rows, true, mixed);
    EXPECT_EQ(be.last_path(), DecodePath::kBatched);
    be.decode(rows, true, plain);  // the same step without the piece: rewrites the same slots alike
    ASSERT_EQ(mixed.logits.size(), kStreams * V);
    EXPECT_EQ(mixed.tokens, plain.tokens) << "step " << steps;
    EXPECT_EQ(std::memcmp(mixed.logits.data(), plain.logits.data(), mixed.logits.size() * 4), 0)
        << "step " << steps << ": a decode row's logits changed with a prompt piece beside it";
    for (int s = 0; s < kStreams; ++s) {
      next[s] = mixed.tokens[s];
      ++pos[s];
    }
    done += piece;
    ++steps;
  }
  const int32_t after = static_cast<int32_t>(rng.below(c.vocab_size));
  const std::vector<float> dev_next = decode_after(be, p, after);
  be.set_routing_capture(nullptr);
  RoutingAudit audit;
  ref.set_forced_routing(&routing, &audit);
  const std::vector<float> want_last = run_prefill(ref, c, p, 0);
  (void)want_last;
  const std::vector<uint16_t> kv = read_kv(be);
  const KvCompare kc = compare_kv(c, kv, ref, p, 5e-3, 2e-2);
  const LogitCompare dc = compare_logits(dev_next, decode_after(ref, p, after));
  expect_routing_exact(audit, static_cast<int64_t>(n + 1) * c.n_layers, kRouteNearTieMixed,
                       "prompt " + std::to_string(n) + " in mixed steps + 1 decode step");
  std::printf("mixed: prompt %d in %d steps beside %d streams: K/V max err / max |ref| layer 0 %.3g, later %.3g "
              "(worst %.2f / %.2f of the bound, %d positions over it); decode after: %.3g\n",
              n, steps, kStreams, kc.max_err[0], kc.max_err[1], kc.worst_ratio[0], kc.worst_ratio[1], kc.bad_positions,
              dc.rel);
  EXPECT_EQ(kc.n_nan, 0) << "unwritten (NaN) K/V inside the prompt";
  EXPECT_EQ(kc.bad_positions, 0) << "positions whose K/V is off";
  EXPECT_EQ(dc.n_nan, 0);
  EXPECT_LE(dc.rel, 1e-2) << "decode after the mixed steps";
  // Bad pieces are refused before anything runs.
  std::vector<DecodeSeq> one(1);
  one[0].chunk = SeqChunk{1, std::span<const int32_t>(&next[0], 1), pos[0], streams[0].table, {}};
  const int32_t bad_token = c.vocab_size;
  SeqChunk bad{0, std::span<const int32_t>(&bad_token, 1), 0, p.table, {}};
  DecodeResult r;
  EXPECT_THROW(be.decode_mixed(std::span<const SeqChunk>(&bad, 1), one, false, r), Error);
  std::vector<int32_t> many(be.max_mixed_prompt_rows() + 1, 1);
  SeqChunk big{0, many, 0, p.table, {}};
  EXPECT_THROW(be.decode_mixed(std::span<const SeqChunk>(&big, 1), one, false, r), Error);
}

// The prefill kernels against the one-token decode path on the same device weights: layer-0 K/V
// depend only on the prompt's tokens, so they agree within bf16 rounding (the q/k/v projections sum
// in a different order, and the input norm's fp32 sum may differ in its last bit).
TEST(Prefill, MatchesOneTokenPath) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = seed_for("prefill vs one-token path");
  auto w = device_weights(c, seed);
  for (bool per_op : {false, true}) {
    auto fast = make_backend(w, 512, per_op);
    auto slow = make_backend(w, 0, per_op);
    SplitMix64 rng(seed + (per_op ? 1 : 0));
    const Prompt p = make_prompt(c, rng, 300);
    poison_kv(*fast);
    poison_kv(*slow);
    const LogitCompare lc = compare_logits(run_prefill(*fast, c, p, 0), run_prefill(*slow, c, p, 0));
    const std::vector<uint16_t> a = read_kv(*fast), b = read_kv(*slow);
    double worst = 0;
    int n_nan = 0;
    for (int kv = 0; kv < 2; ++kv) {
      double mref = 0;
      for (int pos = 0; pos < 300; ++pos)
        for (int g = 0; g < c.n_kv_heads; ++g)
          for (int d = 0; d < c.head_dim; ++d)
            mref = std::max(mref, std::fabs(static_cast<double>(
                                      bf16_bits_to_float(b[kv_index(c, 0, kv, p.table[pos / kBs], g, pos % kBs, d)]))));
      for (int pos = 0; pos < 300; ++pos)
        for (int g = 0; g < c.n_kv_heads; ++g)
          for (int d = 0; d < c.head_dim; ++d) {
            const int64_t i = kv_index(c, 0, kv, p.table[pos / kBs], g, pos % kBs, d);
            const float x = bf16_bits_to_float(a[i]), y = bf16_bits_to_float(b[i]);
            if (!std::isfinite(x) || !std::isfinite(y)) {
              ++n_nan;
              continue;
            }
            worst = std::max(worst, std::fabs(x - y) / (std::ldexp(std::fabs(y), -6) + 1e-3 * mref));
          }
    }
    std::printf("%s: logits %.3g of max |one-token|; layer-0 K/V worst %.2f of the bf16 bound\n",
                per_op ? "cuda-ops" : "cuda-mk", lc.rel, worst);
    EXPECT_EQ(lc.n_nan, 0);
    EXPECT_LE(lc.rel, 1e-2);
    EXPECT_EQ(n_nan, 0);
    EXPECT_LE(worst, 1.0);
  }
}

// Every output row's sum order is fixed by the row alone (GEMM k order, absolute key tiles, slot
// order, k order), so the piece size and the split into calls change nothing, bit for bit.
TEST(Prefill, BitwiseInvariantToPiecesAndSplits) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  const uint64_t seed = seed_for("prefill piece invariance");
  auto w = device_weights(c, seed);
  SplitMix64 rng(seed);
  const Prompt p = make_prompt(c, rng, 2600);
  std::vector<float> first_logits;
  std::vector<uint16_t> first_kv;
  for (int chunk : {8192, 2048, 512, 97, 700}) {  // 8192: the default, the whole prompt in one piece
    auto be = make_backend(w, chunk, false);
    for (int split : {0, 1, 1333}) {
      poison_kv(*be);
      const std::vector<float> logits = run_prefill(*be, c, p, split);
      const std::vector<uint16_t> kv = read_kv(*be);
      if (first_logits.empty()) {
        first_logits = logits;
        first_kv = kv;
        continue;
      }
      EXPECT_TRUE(bitwise_equal(logits.data(), first_logits.data(), logits.size() * 4))
          << "chunk " << chunk << ", split " << split << ": logits differ";
      EXPECT_TRUE(bitwise_equal(kv.data(), first_kv.data(), kv.size() * 2))
          << "chunk " << chunk << ", split " << split << ": KV differs";
    }
  }
}

TEST(Prefill, RejectsBadInput) {
  MD_REQUIRE_GPU();
  const ModelConfig c = preset_config("small");
  auto be = make_backend(device_weights(c, 7), 64, false);
  SplitMix64 rng(7);
  Prompt p = make_prompt(c, rng, 100);
  std::vector<float> logits(c.vocab_size);
  SeqChunk s;
  s.tokens = p.tokens;
  s.block_table = p.table;
  p.tokens[70] = c.vocab_size;
  EXPECT_THROW(be->prefill(s, logits), Error);
  p.tokens[70] = 5;
  s.block_table = std::span<const int32_t>(p.table).first(3);
  EXPECT_THROW(be->prefill(s, logits), Error);
  p.table[2] = kBlocks;
  s.block_table = p.table;
  EXPECT_THROW(be->prefill(s, logits), Error);
  p.table[2] = 0;
  s.start_pos = c.max_position_embeddings - 50;
  EXPECT_THROW(be->prefill(s, logits), Error);
  s.start_pos = 0;
  be->prefill(s, logits);  // still usable after the errors
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace megadecode::test
