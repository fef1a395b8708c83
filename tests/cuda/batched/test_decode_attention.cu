// The split-K paged decode attention of the batched step (src/cuda/batched/decode_attention.h)
// against the tests' naive oracle: ragged contexts around the split and tile edges (1, 15..17,
// 511..513, one past the 64-split cap), GQA 1..8, head dims 32/64/128, odd block sizes, padding rows
// (no keys: zeros), a cache that is NaN everywhere the rows may not read, NaN-poisoned partials and
// outputs. A sliding-window layer's rows over their rings of blocks (only the window's keys written,
// every other slot NaN). Then a row's output alone equals, bit for bit, its output in a batch.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "../../ref/naive_attention.h"
#include "core/check.h"
#include "cuda/batched/batched_plan.h"
#include "cuda/batched/decode_attention.h"
#include "cuda/prefill/prefill_index.h"
#include "../gpu_test_util.h"
#include "kv/kv_cache.h"

namespace megadecode::cuda::batched {
namespace {

using test::DeviceBuffer;

struct Shape {
  int G, gs, D, bs;
};

// A batch of rows over one shuffled paged cache: row r owns its blocks; keys past a row's
// context and every unowned slot are NaN. With a window (a sliding layer), row r owns a ring of
// min(ring_len, its blocks) blocks, position p in entry (p / bs) % ring_len, and only the keys of
// the window are written: a read of an older position finds NaN.
struct Batch {
  Shape s;
  std::vector<int> ctx;  // 0: a padding row
  int window = 0, ring_len = 0;
  int stride = 0;
  std::vector<int32_t> tables;  // [rows][stride]
  std::vector<uint16_t> kc, vc, q;
  int kv_stride = 0;  // keys a row in kf / vf: the most any row reads
  std::vector<float> kf, vf, qf;  // exact values of the bf16 data, kf/vf per (row, key read, g, d)
  std::vector<int32_t> split_begin;
  int n_blocks = 0;
};

Batch make_batch(const Shape& s, std::vector<int> ctx, SplitMix64& rng, int window = 0) {
  Batch b;
  b.s = s;
  b.ctx = std::move(ctx);
  b.window = window;
  b.ring_len = window > 0 ? kv_ring_length(window, s.bs) : 0;
  const int rows = static_cast<int>(b.ctx.size());
  int max_blocks = 1;
  const auto owned = [&](int c) {
    const int nb = (c + s.bs - 1) / s.bs;
    return b.ring_len > 0 ? std::min(nb, b.ring_len) : nb;
  };
  for (int c : b.ctx) {
    b.n_blocks += owned(c);
    max_blocks = std::max(max_blocks, owned(c));
  }
  b.n_blocks += 3;
  b.stride = b.ring_len > 0 ? b.ring_len : table_stride(max_blocks);
  std::vector<int32_t> perm(b.n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = b.n_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  b.tables.assign(static_cast<size_t>(rows) * b.stride, -1);
  const size_t cache = static_cast<size_t>(b.n_blocks) * s.G * s.bs * s.D;
  b.kc.assign(cache, 0xffff);
  b.vc.assign(cache, 0xffff);
  int next = 0;
  for (int c : b.ctx) b.kv_stride = std::max(b.kv_stride, decode_row_keys(c, window).n);
  b.kf.assign(static_cast<size_t>(rows) * b.kv_stride * s.G * s.D, 0.0f);
  b.vf.assign(b.kf.size(), 0.0f);
  for (int r = 0; r < rows; ++r) {
    const int nb = owned(b.ctx[r]);
    for (int j = 0; j < nb; ++j) b.tables[static_cast<size_t>(r) * b.stride + j] = perm[next++];
    const RowKeys keys = decode_row_keys(b.ctx[r], window);
    for (int p = keys.first; p < b.ctx[r]; ++p)
      for (int g = 0; g < s.G; ++g)
        for (int d = 0; d < s.D; ++d) {
          const int64_t o = prefill::kv_offset(b.tables[static_cast<size_t>(r) * b.stride + table_entry(p, s.bs, b.ring_len)],
                                               g, p % s.bs, d, s.G, s.bs, s.D);
          const size_t i = ((static_cast<size_t>(r) * b.kv_stride + p - keys.first) * s.G + g) * s.D + d;
          b.kc[o] = float_to_bf16_bits(2.0f * rng.unit() - 1.0f);
          b.vc[o] = float_to_bf16_bits(2.0f * rng.unit() - 1.0f);
          b.kf[i] = bf16_bits_to_float(b.kc[o]);
          b.vf[i] = bf16_bits_to_float(b.vc[o]);
        }
  }
  const test::Bf16Data q = test::random_bf16(static_cast<size_t>(rows) * s.G * s.gs * s.D, rng, 3.0f);
  b.q = q.bits;
  b.qf = q.values;
  b.split_begin.assign(rows + 1, 0);
  for (int r = 0; r < rows; ++r)
    b.split_begin[r + 1] = b.split_begin[r] + decode_splits(decode_row_keys(b.ctx[r], window).n).n;
  return b;
}

// Runs the kernel on a batch (partials and outputs NaN-poisoned first); returns the bf16 outputs.
std::vector<uint16_t> run(const Batch& b) {
  const Shape& s = b.s;
  const int rows = static_cast<int>(b.ctx.size()), n_heads = s.G * s.gs;
  std::vector<int32_t> lens(b.ctx.begin(), b.ctx.end());
  DeviceBuffer<uint16_t> dq(b.q), dk(b.kc), dv(b.vc), out(static_cast<size_t>(rows) * n_heads * s.D);
  DeviceBuffer<int32_t> dt(b.tables), dl(lens), dsb(b.split_begin);
  const int cap = std::max(1, b.split_begin.back());
  DeviceBuffer<float> po(static_cast<size_t>(cap) * n_heads * s.D), pml(static_cast<size_t>(cap) * n_heads * 2);
  out.poison();
  po.poison();
  pml.poison();
  DecodeAttnArgs a;
  a.q = dq.get();
  a.k_cache = dk.get();
  a.v_cache = dv.get();
  a.block_tables = dt.get();
  a.table_stride = b.stride;
  a.seq_lens = dl.get();
  a.split_begin = dsb.get();
  a.n_rows = rows;
  a.n_kv_heads = s.G;
  a.group_size = s.gs;
  a.head_dim = s.D;
  a.block_size = s.bs;
  a.window = b.window;
  a.ring_len = b.ring_len;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  a.part_o = po.get();
  a.part_ml = pml.get();
  a.split_capacity = cap;
  a.out = out.get();
  decode_attention(a, nullptr);
  return out.download();
}

// The kernel's outputs on a batch against the naive oracle over the keys each row reads.
void expect_matches_oracle(const Batch& b) {
  const Shape& s = b.s;
  const std::vector<float> got = test::bf16_to_float(run(b));
  const int n_heads = s.G * s.gs;
  double worst = 0;
  int n_nan = 0, padding_nonzero = 0;
  for (size_t r = 0; r < b.ctx.size(); ++r)
    for (int h = 0; h < n_heads; ++h) {
      const float* out = got.data() + (r * n_heads + h) * s.D;
      if (b.ctx[r] == 0) {
        for (int d = 0; d < s.D; ++d) padding_nonzero += out[d] != 0.0f;
        continue;
      }
      const int g = h / s.gs;
      const float* qh = b.qf.data() + (r * n_heads + h) * s.D;
      auto kv = [&](const std::vector<float>& x) {
        return [&x, &s, r, g, &b](int j, int d) {
          return x[((r * b.kv_stride + j) * s.G + g) * s.D + d];
        };
      };
      const std::vector<double> want = test::naive::attention<double>(
          decode_row_keys(b.ctx[r], b.window).n, s.D, 1.0 / std::sqrt(static_cast<double>(s.D)), [&](int d) { return qh[d]; }, kv(b.kf), kv(b.vf));
      for (int d = 0; d < s.D; ++d) {
        if (!std::isfinite(out[d])) {
          ++n_nan;
          continue;
        }
        worst = std::max(worst, std::fabs(out[d] - want[d]));
      }
    }
  // P is rounded to bf16 for the MMA (and summed rounded): weights off by <= 2^-8 relative, so
  // |err| <= ~2^-8 max |V| on top of the output's bf16 rounding (as the prefill attention).
  EXPECT_EQ(n_nan, 0) << "NaN outputs: unwritten rows, or keys read past a row's context";
  EXPECT_EQ(padding_nonzero, 0) << "padding rows must be zeros";
  EXPECT_LE(worst, 1e-2);
}

TEST(DecodeAttention, SplitsMatchTheNaiveOracle) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("DecodeAttention"));
  const int over_cap = kMaxSplits * kSplitMinKeys + 777;  // longer than 64 splits of the minimum
  struct Case {
    Shape s;
    std::vector<int> ctx;
  };
  const std::vector<Case> cases = {
      {{4, 8, 128, 16}, {1, 15, 16, 17, 0, 511, 512, 513, 2000, 0, 1100}},
      {{2, 4, 64, 5}, {3, 70, 1030, 0}},
      {{3, 3, 32, 7}, {1, 2, 700}},
      {{1, 1, 128, 16}, {over_cap}},
      {{4, 8, 128, 16}, std::vector<int>(40, 1500)},  // many items per CTA
  };
  for (const Case& c : cases) {
    const Shape& s = c.s;
    SCOPED_TRACE(::testing::Message() << "G " << s.G << " gs " << s.gs << " D " << s.D << " bs " << s.bs);
    expect_matches_oracle(make_batch(s, c.ctx, rng));
  }
}

// A sliding-window layer (window W): each row reads its last min(ctx, W) keys from its ring of
// kv_ring_length(W, bs) blocks, whose other slots are NaN; splits over the window's keys alone.
TEST(DecodeAttention, SlidingWindowOverARingMatchesTheNaiveOracle) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("DecodeAttention ring"));
  struct Case {
    Shape s;
    int window;
    std::vector<int> ctx;
  };
  const std::vector<Case> cases = {
      {{4, 8, 128, 16}, 4096, {1, 4095, 4096, 4097, 0, 9000, 20000, 513}},  // North's window
      {{2, 4, 64, 5}, 24, {3, 24, 25, 49, 50, 51, 333, 0}},                 // a ring of 6 odd blocks
      {{3, 3, 32, 7}, 700, {1, 699, 700, 701, 1500}},                      // several splits a window
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "G " << c.s.G << " gs " << c.s.gs << " D " << c.s.D << " bs " << c.s.bs
                                      << " window " << c.window);
    expect_matches_oracle(make_batch(c.s, c.ctx, rng, c.window));
  }
}

TEST(DecodeAttention, ARowAloneEqualsItInABatchBitwise) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("DecodeAttention invariance"));
  const Shape s{4, 8, 128, 16};
  std::vector<int> ctx;
  for (int i = 0; i < 37; ++i) ctx.push_back(1 + static_cast<int>(rng.below(5000)));
  const Batch all = make_batch(s, ctx, rng);
  const std::vector<uint16_t> batch_out = run(all);
  const size_t per_row = static_cast<size_t>(s.G) * s.gs * s.D;
  for (int r : {0, 17, 36}) {
    Batch one = all;  // the same cache and tables, one row
    one.ctx = {all.ctx[r]};
    one.tables.assign(all.tables.begin() + static_cast<size_t>(r) * all.stride,
                      all.tables.begin() + static_cast<size_t>(r + 1) * all.stride);
    one.q.assign(all.q.begin() + r * per_row, all.q.begin() + (r + 1) * per_row);
    one.split_begin = {0, decode_splits(all.ctx[r]).n};
    const std::vector<uint16_t> alone = run(one);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch_out.begin() + r * per_row)) << "row " << r;
  }
}

TEST(DecodeAttention, BadArgumentsAreErrors) {
  DecodeAttnArgs a;
  a.head_dim = 96;
  EXPECT_THROW(decode_attention(a, nullptr), Error);
  a.head_dim = 128;
  a.group_size = 9;
  a.n_kv_heads = 1;
  EXPECT_THROW(decode_attention(a, nullptr), Error);
}

}  // namespace
}  // namespace megadecode::cuda::batched
