// GPU tests of q/k norm + RoPE + KV append and of paged decode attention (+ split merge) against
// CPU references, with shuffled block tables and NaN beyond each sequence's context.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "gpu_test_util.h"
#include "kernels/kernels.h"

namespace megadecode::cuda {
namespace {

using test::DeviceBuffer;

void cpu_norm_rope(float* v, const float* w, int d, int pos, float theta, float eps) {
  if (w != nullptr) {
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += double(v[i]) * v[i];
    const float r = 1.0f / std::sqrt(float(ss / d) + eps);
    for (int i = 0; i < d; ++i) v[i] = round_bf16(round_bf16(v[i] * r) * w[i]);
  }
  std::vector<float> x(v, v + d);
  for (int i = 0; i < d; ++i) {
    const int fi = i % (d / 2);
    const float inv_freq = 1.0f / std::pow(theta, float(2 * fi) / float(d));
    const float ang = float(pos) * inv_freq;
    const float c = std::cos(ang), s = std::sin(ang);
    v[i] = i < d / 2 ? x[i] * c - x[i + d / 2] * s : x[i] * c + x[i - d / 2] * s;
  }
}

TEST(QkNormRope, MatchesReferenceAndWritesOnlyItsSlots) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("QkNormRope"));
  struct Cfg { int heads, kv, d; };
  for (Cfg c : {Cfg{32, 4, 128}, Cfg{8, 2, 32}, Cfg{4, 4, 64}}) {
    for (int n_tokens : {1, 3, 17}) {
      SCOPED_TRACE(::testing::Message() << "heads=" << c.heads << " d=" << c.d << " tokens=" << n_tokens);
      const int bs = 16, max_blocks = 8, n_blocks = n_tokens * max_blocks;
      const int width = (c.heads + 2 * c.kv) * c.d, stride = width + 4;
      std::vector<float> qkv(size_t(n_tokens) * stride);
      for (auto& v : qkv) v = rng.normal() * 2.0f;
      auto qn = test::random_bf16(c.d, rng, 1.5f), kn = test::random_bf16(c.d, rng, 1.5f);
      std::vector<int32_t> pos(n_tokens), table(size_t(n_tokens) * max_blocks);
      std::iota(table.begin(), table.end(), 0);
      for (size_t i = table.size(); i > 1; --i) std::swap(table[i - 1], table[rng.below(i)]);
      for (auto& p : pos) p = int(rng.below(bs * max_blocks));
      DeviceBuffer<float> dqkv(qkv);
      DeviceBuffer<uint16_t> dqn(qn.bits), dkn(kn.bits), q_out(size_t(n_tokens) * c.heads * c.d);
      const size_t cache = size_t(n_blocks) * c.kv * bs * c.d;
      DeviceBuffer<uint16_t> kc(cache), vc(cache);
      DeviceBuffer<int32_t> dpos(pos), dtab(table);
      q_out.poison();
      kc.poison();
      vc.poison();
      QkNormRopeArgs a{dqkv.get(), stride, dqn.get(), dkn.get(), dpos.get(), dtab.get(), max_blocks, q_out.get(),
                       kc.get(), vc.get(), n_tokens, c.heads, c.kv, c.d, bs, 1e-6f, 1e6f};
      qk_norm_rope(a, nullptr);
      const auto q = test::bf16_to_float(q_out.download());
      const auto k = test::bf16_to_float(kc.download()), v = test::bf16_to_float(vc.download());
      std::vector<float> got, ref;
      size_t k_written = 0;
      for (float x : k) k_written += std::isnan(x) ? 0 : 1;
      EXPECT_EQ(k_written, size_t(n_tokens) * c.kv * c.d) << "K cache slots outside the new tokens were written";
      for (int t = 0; t < n_tokens; ++t) {
        for (int h = 0; h < c.heads + 2 * c.kv; ++h) {
          std::vector<float> x(&qkv[t * stride + h * c.d], &qkv[t * stride + h * c.d] + c.d);
          const float* out;
          if (h < c.heads) {
            cpu_norm_rope(x.data(), qn.values.data(), c.d, pos[t], 1e6f, 1e-6f);
            out = &q[(size_t(t) * c.heads + h) * c.d];
          } else {
            const bool is_k = h < c.heads + c.kv;
            const int kvh = h - c.heads - (is_k ? 0 : c.kv);
            if (is_k) cpu_norm_rope(x.data(), kn.values.data(), c.d, pos[t], 1e6f, 1e-6f);
            const size_t slot = ((size_t(table[t * max_blocks + pos[t] / bs]) * c.kv + kvh) * bs + pos[t] % bs) * c.d;
            out = (is_k ? k.data() : v.data()) + slot;
          }
          for (int i = 0; i < c.d; ++i) {
            got.push_back(out[i]);
            ref.push_back(x[i]);
          }
        }
      }
      const auto rep = test::compare(got, ref);
      EXPECT_LE(rep.rel(), 1e-2) << "worst " << rep.worst << " err " << rep.max_abs_err;
    }
  }
}

struct AttnCase {
  std::vector<int> ctx;
  int n_splits;
};

void run_attention_case(const AttnCase& tc, int heads, int kv, int d, int bs, SplitMix64& rng) {
  const int n_seqs = int(tc.ctx.size());
  SCOPED_TRACE(::testing::Message() << "seqs=" << n_seqs << " first ctx=" << tc.ctx[0] << " splits=" << tc.n_splits
                                    << " d=" << d << " bs=" << bs);
  int max_blocks = 0;
  for (int c : tc.ctx) max_blocks = std::max(max_blocks, (c + bs - 1) / bs + 1);
  const int n_blocks = n_seqs * max_blocks;
  std::vector<int32_t> table(size_t(n_seqs) * max_blocks);
  std::iota(table.begin(), table.end(), 0);
  for (size_t i = table.size(); i > 1; --i) std::swap(table[i - 1], table[rng.below(i)]);
  const size_t cache = size_t(n_blocks) * kv * bs * d;
  // NaN everywhere, then real values only inside each context: any read past it poisons the output.
  std::vector<uint16_t> kc(cache, 0x7fc0), vc(cache, 0x7fc0);
  for (int s = 0; s < n_seqs; ++s)
    for (int t = 0; t < tc.ctx[s]; ++t)
      for (int h = 0; h < kv; ++h)
        for (int i = 0; i < d; ++i) {
          const size_t o = ((size_t(table[s * max_blocks + t / bs]) * kv + h) * bs + t % bs) * d + i;
          kc[o] = float_to_bf16_bits(rng.normal());
          vc[o] = float_to_bf16_bits(rng.normal());
        }
  auto q = test::random_bf16(size_t(n_seqs) * heads * d, rng, 2.0f);
  DeviceBuffer<uint16_t> dq(q.bits), dk(kc), dv(vc), out(size_t(n_seqs) * heads * d);
  DeviceBuffer<int32_t> dtab(table), dctx(std::vector<int32_t>(tc.ctx.begin(), tc.ctx.end()));
  DeviceBuffer<float> o_part(size_t(n_seqs) * heads * tc.n_splits * d), ml_part(size_t(n_seqs) * heads * tc.n_splits * 2);
  const float scale = 1.0f / std::sqrt(float(d));
  AttentionArgs a{dq.get(), dk.get(), dv.get(), dtab.get(), dctx.get(), max_blocks, n_seqs, heads, kv, d, bs,
                  tc.n_splits, scale, o_part.get(), ml_part.get()};
  auto run = [&] {
    out.poison();
    o_part.poison();
    ml_part.poison();
    attention_decode(a, nullptr);
    attention_merge(o_part.get(), ml_part.get(), out.get(), n_seqs, heads, tc.n_splits, d, nullptr);
    return out.download();
  };
  const auto got_bits = run();
  const auto got = test::bf16_to_float(got_bits);
  std::vector<float> ref(got.size());
  const int group = heads / kv;
  for (int s = 0; s < n_seqs; ++s)
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / group;
      std::vector<double> sc(tc.ctx[s]);
      double mx = -1e300;
      for (int t = 0; t < tc.ctx[s]; ++t) {
        const size_t o = ((size_t(table[s * max_blocks + t / bs]) * kv + kvh) * bs + t % bs) * d;
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += double(q.values[(size_t(s) * heads + h) * d + i]) * bf16_bits_to_float(kc[o + i]);
        sc[t] = dot * scale;
        mx = std::max(mx, sc[t]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (int i = 0; i < d; ++i) {
        double acc = 0;
        for (int t = 0; t < tc.ctx[s]; ++t) {
          const size_t o = ((size_t(table[s * max_blocks + t / bs]) * kv + kvh) * bs + t % bs) * d;
          acc += sc[t] * bf16_bits_to_float(vc[o + i]);
        }
        ref[(size_t(s) * heads + h) * d + i] = float(acc / sum);
      }
    }
  const auto rep = test::compare(got, ref);
  EXPECT_EQ(rep.n_bad, 0u) << "non-finite outputs (unwritten, or KV past the context was read)";
  EXPECT_LE(rep.rel(), 1e-2) << "worst " << rep.worst << " err " << rep.max_abs_err << " max|ref| " << rep.max_abs_ref;
  const auto again = run();
  EXPECT_TRUE(test::bitwise_equal(got_bits.data(), again.data(), again.size() * 2)) << "repeat differs";
}

TEST(Attention, RaggedContextsAndSplits) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Attention.RaggedContextsAndSplits"));
  const std::vector<AttnCase> cases = {
      {{1}, 1}, {{97}, 1}, {{97}, 3}, {{15, 16, 17}, 2}, {{4096}, 8}, {{4096, 1, 300}, 5},
      {{2, 64, 65, 63, 128, 1000, 33}, 4}, {{5}, 8} /* more splits than tiles: empty splits */};
  for (const auto& c : cases) run_attention_case(c, 32, 4, 128, 16, rng);
  run_attention_case({{97, 1, 200}, 2}, 8, 2, 32, 16, rng);   // tiny preset shape
  run_attention_case({{97, 40}, 3}, 16, 1, 64, 32, rng);       // group of 16, block 32
  // Batch 64 with random contexts.
  std::vector<int> ctx(64);
  for (auto& c : ctx) c = 1 + int(rng.below(700));
  run_attention_case({ctx, 2}, 32, 4, 128, 16, rng);
}

TEST(Attention, RejectsBadArguments) {
  AttentionArgs a{};
  a.head_dim = 96;
  a.n_heads = 32;
  a.n_kv_heads = 4;
  a.n_splits = 1;
  a.block_size = 16;
  a.max_blocks = 1;
  EXPECT_THROW(attention_decode(a, nullptr), Error);
  a.head_dim = 128;
  a.n_kv_heads = 5;
  EXPECT_THROW(attention_decode(a, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda
