// The prefill kernels one at a time (src/cuda/prefill/prefill_kernels.h) against plain host references,
// on small awkward shapes, so a failure of the end-to-end test (test_prefill.cu) points at one
// kernel: the device-built MoE lists (with padding rows) and the grouped expert GEMMs of the GEMM
// engine over them (its own tests: test_gemm.cu), causal paged attention
// (GQA 1..8, head_dim 32/64/128, odd block sizes, start_pos > 0, NaN-poisoned cache past the
// written positions, sliding windows), q/k norm + RoPE + KV write (and cohere2_moe's modes: no
// norms, interleaved or no RoPE, a ring, a cache offset), and the residual norms. Small enough for
// compute-sanitizer (memcheck / racecheck / synccheck).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "../../ref/naive_attention.h"
#include "core/check.h"
#include "cuda/common/kernels.h"
#include "cuda/common/weight_pack.cuh"
#include "cuda/gemm/gemm.h"
#include "cuda/prefill/prefill_kernels.h"
#include "../gemm_test_util.h"
#include "../gpu_test_util.h"

namespace megadecode::cuda::prefill {
namespace {

using test::DeviceBuffer;
using test::packed_weights;
using test::silu_ref;
using test::worst_ratio;

// Routing with one hot expert (> 1 tile of 128 slots) and a few empty ones; the device lists must
// equal the host's (expert, token, k) slot order, then the grouped gate/up (SwiGLU) and down GEMMs
// must match per slot.
TEST(PrefillMoe, ListsAndGroupedGemmsMatchHost) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("PrefillMoe"));
  const int T = 300, K = 4, E = 20, H = 96, I = 48;
  constexpr int kTileTokens = 128;
  std::vector<int32_t> ids(T * K);
  for (int t = 0; t < T; ++t) {
    std::set<int> chosen;
    if (rng.unit() < 0.6f) chosen.insert(3);  // the hot expert: ~180 slots, two tiles
    while (static_cast<int>(chosen.size()) < K) chosen.insert(static_cast<int>(rng.below(E - 4)));  // 16..19 empty
    std::vector<int> order(chosen.begin(), chosen.end());
    for (int i = K - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);  // top-k order is not sorted
    for (int k = 0; k < K; ++k) ids[t * K + k] = order[k];
  }
  // Host lists.
  std::vector<int32_t> counts(E, 0), offsets(E + 1), token_slot(T * K), slot_token(T * K);
  for (int32_t e : ids) ++counts[e];
  const int cap = gemm::moe_tile_capacity(T * K, E, kTileTokens);
  std::vector<gemm::MoeTile> tiles(cap);
  const int n_tiles = gemm::build_moe_tiles(counts.data(), E, kTileTokens, offsets.data(), tiles.data(), cap);
  ASSERT_GT(n_tiles, 0);
  for (int e = 0, slot = 0; e < E; ++e)
    for (int i = 0; i < T * K; ++i)
      if (ids[i] == e) {
        token_slot[i] = slot;
        slot_token[slot++] = i / K;
      }

  DeviceBuffer<int32_t> d_ids(ids), rank(T * K), d_counts(E), d_offsets(E + 1), d_ts(T * K), n_t(1),
      err(1);
  DeviceBuffer<gemm::MoeTile> d_tiles(cap);
  for (auto* b : {&rank, &d_counts, &d_offsets, &d_ts, &n_t}) b->poison();
  d_tiles.poison();  // the kernel writes n_tiles of the cap entries; the download reads them all
  err.fill_bytes(0);
  MoeListArgs ml;
  ml.topk_ids = d_ids.get();
  ml.n_tokens = T;
  ml.top_k = K;
  ml.n_experts = E;
  ml.rank = rank.get();
  ml.counts = d_counts.get();
  ml.offsets = d_offsets.get();
  ml.token_slot = d_ts.get();
  ml.tiles = d_tiles.get();
  ml.n_tiles = n_t.get();
  ml.tile_tokens = kTileTokens;
  ml.tile_capacity = cap;
  ml.error = err.get();
  // Each routed row copied to its slots, for a gate/up GEMM over contiguous rows.
  const test::Bf16Data xh = test::random_bf16(static_cast<size_t>(T) * H, rng, 1.0f);
  DeviceBuffer<uint16_t> x(xh.bits), x_slots(static_cast<size_t>(T) * K * H);
  x_slots.poison();
  ml.x = x.get();
  ml.x_stride = H;
  ml.row_elems = H;
  ml.x_slots = x_slots.get();
  ml.x_slots_stride = H;
  moe_lists(ml, nullptr);
  EXPECT_EQ(err.download()[0], 0);
  {
    const std::vector<uint16_t> got = x_slots.download();
    for (int slot = 0; slot < T * K; ++slot)
      ASSERT_TRUE(std::equal(got.begin() + int64_t{slot} * H, got.begin() + int64_t{slot + 1} * H,
                             xh.bits.begin() + int64_t{slot_token[slot]} * H))
          << "slot " << slot << " is not its token's row";
  }
  EXPECT_EQ(d_counts.download(), counts);
  EXPECT_EQ(d_offsets.download(), offsets);
  EXPECT_EQ(d_ts.download(), token_slot);
  ASSERT_EQ(n_t.download()[0], n_tiles);
  const std::vector<gemm::MoeTile> got_tiles = d_tiles.download();
  for (int i = 0; i < n_tiles; ++i) {
    EXPECT_EQ(got_tiles[i].expert, tiles[i].expert) << "tile " << i;
    EXPECT_EQ(got_tiles[i].slot0, tiles[i].slot0) << "tile " << i;
    EXPECT_EQ(got_tiles[i].n, tiles[i].n) << "tile " << i;
  }

  // Grouped GEMMs: fused gate/up [2I][H] and down [H][I] per expert, packed back to back.
  const int64_t up_stride = packed_elements(2 * I, H), down_stride = packed_elements(H, I);
  DeviceBuffer<uint16_t> w_up(up_stride * E), w_down(down_stride * E);
  std::vector<test::Bf16Data> up_h, down_h;
  for (int e = 0; e < E; ++e) {
    up_h.push_back(packed_weights(w_up.get() + e * up_stride, 2 * I, H, rng, 0.3f));
    down_h.push_back(packed_weights(w_down.get() + e * down_stride, H, I, rng, 0.3f));
  }
  DeviceBuffer<uint16_t> hidden(static_cast<size_t>(T) * K * I);
  DeviceBuffer<float> down(static_cast<size_t>(T) * K * H);
  hidden.poison();
  down.poison();
  gemm::GemmArgs up;
  up.w = w_up.get();
  up.w_expert_stride = up_stride;
  up.n_experts = E;
  up.n_rows = 2 * I;
  up.k = H;
  up.x = x_slots.get();  // the rows moe_lists copied into slot order
  up.x_stride = H;
  up.x_rows = T * K;
  up.tiles = d_tiles.get();
  up.n_tiles = n_t.get();
  up.tile_capacity = cap;
  up.token_groups = kTileTokens / 8;
  up.y = hidden.get();
  up.y_stride = I;
  gemm::gemm(up, gemm::Epilogue::kSwiGlu, nullptr);
  gemm::GemmArgs dn;
  dn.w = w_down.get();
  dn.w_expert_stride = down_stride;
  dn.n_experts = E;
  dn.n_rows = H;
  dn.k = I;
  dn.x = hidden.get();
  dn.x_stride = I;
  dn.tiles = d_tiles.get();
  dn.n_tiles = n_t.get();
  dn.tile_capacity = cap;
  dn.token_groups = kTileTokens / 8;
  dn.x_rows = T * K;
  dn.y = down.get();
  dn.y_stride = H;
  gemm::gemm(dn, gemm::Epilogue::kStore, nullptr);
  const std::vector<float> hid = test::bf16_to_float(hidden.download());
  const std::vector<float> dout = down.download();
  std::vector<double> want_h, want_d;
  std::vector<int> slot_expert(T * K);
  for (int e = 0; e < E; ++e)
    for (int s = offsets[e]; s < offsets[e + 1]; ++s) slot_expert[s] = e;
  for (int s = 0; s < T * K; ++s) {
    const int e = slot_expert[s], tok = slot_token[s];
    auto up_dot = [&](int row) {
      double acc = 0;
      for (int kk = 0; kk < H; ++kk)
        acc += double(up_h[e].values[static_cast<size_t>(row) * H + kk]) * xh.values[static_cast<size_t>(tok) * H + kk];
      return acc;
    };
    for (int c = 0; c < I; ++c) {
      const int gate = (c / 8) * 16 + c % 8;
      want_h.push_back(silu_ref(up_dot(gate)) * up_dot(gate + 8));
    }
    for (int r = 0; r < H; ++r) {  // from the device's own hidden row, so the check is the down GEMM alone
      double acc = 0;
      for (int kk = 0; kk < I; ++kk)
        acc += double(down_h[e].values[static_cast<size_t>(r) * I + kk]) * hid[static_cast<size_t>(s) * I + kk];
      want_d.push_back(acc);
    }
  }
  EXPECT_LE(worst_ratio(hid, want_h, 1e-4), 1.0) << "grouped gate/up (SwiGLU)";
  EXPECT_LE(worst_ratio(dout, want_d, 1e-4), 1.0) << "grouped down";

  // An expert id out of range is reported, and the lists stay in bounds.
  ids[7] = E;
  d_ids.upload(ids);
  moe_lists(ml, nullptr);
  EXPECT_EQ(err.download()[0], 1);
  for (int32_t s : d_ts.download()) EXPECT_TRUE(s >= 0 && s < T * K);

  // Padding rows of a decode batch (position < 0) take no slot, not even with a bad id (row 1 holds
  // entry 7), and small tiles (8 slots) split the hot expert into many.
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = (t % 3 == 1) ? -1 : t;
  std::vector<int32_t> pcounts(E, 0), poffsets(E + 1), pslot(T * K, 0);
  for (int i = 0; i < T * K; ++i)
    if (pos[i / K] >= 0) ++pcounts[ids[i]];
  const int pcap = gemm::moe_tile_capacity(T * K, E, 8);
  std::vector<gemm::MoeTile> ptiles(pcap);
  const int pn = gemm::build_moe_tiles(pcounts.data(), E, 8, poffsets.data(), ptiles.data(), pcap);
  for (int e = 0, slot = 0; e < E; ++e)
    for (int i = 0; i < T * K; ++i)
      if (pos[i / K] >= 0 && ids[i] == e) pslot[i] = slot++;
  DeviceBuffer<int32_t> d_pos(pos);
  DeviceBuffer<gemm::MoeTile> d_ptiles(pcap);
  d_ptiles.poison();  // the download reads all pcap entries; the kernel writes pn of them
  err.fill_bytes(0);
  d_ts.poison();
  ml.positions = d_pos.get();
  ml.tiles = d_ptiles.get();
  ml.tile_tokens = 8;
  ml.tile_capacity = pcap;
  moe_lists(ml, nullptr);
  EXPECT_EQ(err.download()[0], 0) << "a padding row's expert id was checked";
  EXPECT_EQ(d_counts.download(), pcounts);
  EXPECT_EQ(d_offsets.download(), poffsets);
  EXPECT_EQ(d_ts.download(), pslot);
  ASSERT_EQ(n_t.download()[0], pn);
  const std::vector<gemm::MoeTile> got_p = d_ptiles.download();
  for (int i = 0; i < pn; ++i) {
    EXPECT_EQ(got_p[i].expert, ptiles[i].expert) << "tile " << i;
    EXPECT_EQ(got_p[i].slot0, ptiles[i].slot0) << "tile " << i;
    EXPECT_EQ(got_p[i].n, ptiles[i].n) << "tile " << i;
  }
}

struct AttnCase {
  int G, gs, D, bs, start, T, splits = 1;  // key splits (attention only)
  int window = 0;                          // a sliding layer's window (attention only; 0: none)
};

TEST(PrefillAttention, CausalPagedMatchesHost) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("PrefillAttention"));
  // Block sizes: odd (every row copied by the producer warp), 8, 16 and 32 (TMA boxes of whole runs, the
  // last partial run copied), 256 (a block longer than a key tile); key splits with partials and a merge.
  for (const AttnCase c : {AttnCase{2, 4, 32, 5, 0, 1, 1}, AttnCase{2, 4, 32, 5, 0, 70, 1},
                           AttnCase{1, 8, 128, 16, 77, 130, 1}, AttnCase{3, 3, 64, 7, 100, 45, 1},
                           AttnCase{1, 1, 128, 16, 0, 200, 1}, AttnCase{4, 8, 128, 16, 190, 33, 1},
                           AttnCase{2, 4, 64, 32, 300, 150, 1}, AttnCase{1, 8, 128, 256, 500, 140, 1},
                           AttnCase{2, 2, 128, 8, 0, 300, 1}, AttnCase{1, 8, 128, 16, 1000, 37, 3},
                           // sliding windows: inside one key tile, across tiles, 1 key, over the prefix, split
                           AttnCase{2, 4, 64, 5, 0, 300, 1, 37}, AttnCase{1, 8, 128, 16, 300, 200, 1, 100},
                           AttnCase{2, 2, 128, 8, 90, 130, 1, 1}, AttnCase{1, 1, 128, 16, 4000, 250, 1, 4096},
                           AttnCase{4, 8, 128, 16, 700, 260, 1, 300}, AttnCase{1, 8, 128, 16, 1000, 37, 3, 600}}) {
    SCOPED_TRACE(::testing::Message() << "G " << c.G << " gs " << c.gs << " D " << c.D << " bs " << c.bs << " start "
                                      << c.start << " T " << c.T << " splits " << c.splits << " window " << c.window);
    const int n_heads = c.G * c.gs, n_pos = c.start + c.T;
    const int used = (n_pos + c.bs - 1) / c.bs, n_blocks = used + 3;
    std::vector<int32_t> table(n_blocks);
    std::iota(table.begin(), table.end(), 0);
    for (int i = n_blocks - 1; i > 0; --i) std::swap(table[i], table[rng.below(i + 1)]);
    const size_t cache_elems = static_cast<size_t>(n_blocks) * c.G * c.bs * c.D;
    std::vector<uint16_t> kc(cache_elems, 0xffff), vc(cache_elems, 0xffff);  // NaN past the written positions
    std::vector<float> kf(static_cast<size_t>(n_pos) * c.G * c.D), vf(kf.size());
    for (int p = 0; p < n_pos; ++p)
      for (int g = 0; g < c.G; ++g)
        for (int d = 0; d < c.D; ++d) {
          const int64_t o = kv_offset(table[p / c.bs], g, p % c.bs, d, c.G, c.bs, c.D);
          const size_t i = (static_cast<size_t>(p) * c.G + g) * c.D + d;
          kc[o] = float_to_bf16_bits(2.0f * rng.unit() - 1.0f);
          vc[o] = float_to_bf16_bits(2.0f * rng.unit() - 1.0f);
          kf[i] = bf16_bits_to_float(kc[o]);
          vf[i] = bf16_bits_to_float(vc[o]);
        }
    const test::Bf16Data q = test::random_bf16(static_cast<size_t>(c.T) * n_heads * c.D, rng, 3.0f);
    DeviceBuffer<uint16_t> dq(q.bits), dk(kc), dv(vc), out(static_cast<size_t>(c.T) * n_heads * c.D);
    DeviceBuffer<int32_t> dt(table);
    out.poison();
    AttnArgs a;
    a.q = dq.get();
    a.k_cache = dk.get();
    a.v_cache = dv.get();
    a.block_table = dt.get();
    a.start_pos = c.start;
    a.n_tokens = c.T;
    a.n_kv_heads = c.G;
    a.group_size = c.gs;
    a.head_dim = c.D;
    a.block_size = c.bs;
    a.kv_blocks = n_blocks;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    a.window = c.window;
    a.out = out.get();
    const int q_tiles = attn_q_tiles(c.T, c.gs);
    DeviceBuffer<float> part_o(static_cast<size_t>(q_tiles) * c.G * c.splits * kAttnRows * c.D),
        part_ml(static_cast<size_t>(q_tiles) * c.G * c.splits * kAttnRows * 2);
    part_o.poison();
    part_ml.poison();
    a.key_splits = c.splits;
    a.part_o = part_o.get();
    a.part_ml = part_ml.get();
    attention(a, nullptr);
    const std::vector<float> got = test::bf16_to_float(out.download());
    std::vector<double> want(got.size());
    for (int t = 0; t < c.T; ++t)
      for (int h = 0; h < n_heads; ++h) {
        const int g = h / c.gs, pos = c.start + t;
        const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;  // the row's first key
        const float* qh = q.values.data() + (static_cast<size_t>(t) * n_heads + h) * c.D;
        auto kv = [&](const std::vector<float>& x) {
          return [&x, g, &c, lo](int j, int d) { return x[(static_cast<size_t>(lo + j) * c.G + g) * c.D + d]; };
        };
        const std::vector<double> head =
            test::naive::attention<double>(pos + 1 - lo, c.D, a.scale, [&](int d) { return qh[d]; }, kv(kf), kv(vf));
        std::copy(head.begin(), head.end(), want.begin() + (static_cast<size_t>(t) * n_heads + h) * c.D);
      }
    // P is rounded to bf16 for the MMA (and summed rounded): a convex combination with weights off by
    // <= 2^-8 relative, so |err| <= ~2^-8 max |V| = 2^-8 on top of the output's bf16 rounding.
    double worst = 0;
    int n_bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(got[i])) {
        ++n_bad;
        continue;
      }
      worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    EXPECT_EQ(n_bad, 0) << "NaN outputs: unwritten rows, or keys read past the causal end";
    EXPECT_LE(worst, 1e-2);
  }
}

TEST(PrefillQkRope, NormRopeAndKvWriteMatchHost) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("PrefillQkRope"));
  // Modes: q/k norms + NeoX RoPE (qwen3_moe); no norms + interleaved RoPE + a cache offset (a
  // sliding layer's prefill scratch); no norms + no RoPE (a NoPE layer) into a ring of blocks.
  struct Mode {
    bool normed, rope, interleaved, ring, offset;
  };
  for (const Mode m : {Mode{true, true, false, false, false}, Mode{false, true, true, false, true},
                       Mode{false, false, false, true, false}})
  for (const AttnCase c : {AttnCase{2, 4, 32, 5, 13, 20}, AttnCase{4, 8, 128, 16, 1000, 9}, AttnCase{3, 1, 64, 3, 0, 7}}) {
    SCOPED_TRACE(::testing::Message() << "G " << c.G << " gs " << c.gs << " D " << c.D << " normed " << m.normed
                                      << " rope " << m.rope << " interleaved " << m.interleaved << " ring " << m.ring
                                      << " offset " << m.offset);
    const int ring_len = m.ring ? (c.T + c.bs - 1) / c.bs + 1 : 0;  // the piece's positions in distinct slots
    const int offset = m.offset ? c.start / 2 : 0;
    auto entry = [&](int pos) {
      const int cp = pos - offset;
      return m.ring ? (cp / c.bs) % ring_len : cp / c.bs;
    };
    const int rows = c.G * (c.gs + 2) * c.D, n_heads = c.G * c.gs, half = c.D / 2;
    const int n_pos = c.start + c.T, n_blocks = (n_pos + c.bs - 1) / c.bs + 2;
    std::vector<int32_t> table(n_blocks);
    std::iota(table.begin(), table.end(), 0);
    for (int i = n_blocks - 1; i > 0; --i) std::swap(table[i], table[rng.below(i + 1)]);
    std::vector<float> qkv(static_cast<size_t>(c.T) * rows);
    for (float& v : qkv) v = 4.0f * (2.0f * rng.unit() - 1.0f);
    const test::Bf16Data qn = test::random_bf16(c.D, rng, 2.0f), kn = test::random_bf16(c.D, rng, 2.0f);
    std::vector<float> inv(half);
    for (int i = 0; i < half; ++i) inv[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / static_cast<float>(c.D));
    std::vector<float> cs(static_cast<size_t>(n_pos) * c.D);  // the RoPE table: (cos, sin) per position, frequency
    for (int pos = 0; pos < n_pos; ++pos)
      for (int i = 0; i < half; ++i) {
        cs[(static_cast<size_t>(pos) * half + i) * 2] = std::cos(static_cast<float>(pos) * inv[i]);
        cs[(static_cast<size_t>(pos) * half + i) * 2 + 1] = std::sin(static_cast<float>(pos) * inv[i]);
      }
    const size_t cache_elems = static_cast<size_t>(n_blocks) * c.G * c.bs * c.D;
    DeviceBuffer<float> dqkv(qkv), dcs(cs);
    DeviceBuffer<uint16_t> dqn(qn.bits), dkn(kn.bits), q(static_cast<size_t>(c.T) * n_heads * c.D), kc(cache_elems),
        vc(cache_elems);
    DeviceBuffer<int32_t> dt(table);
    q.poison();
    kc.poison();
    vc.poison();
    QkRopeArgs a;
    a.qkv = dqkv.get();
    a.q_norm = m.normed ? dqn.get() : nullptr;
    a.k_norm = m.normed ? dkn.get() : nullptr;
    a.use_rope = m.rope;
    a.rope_interleaved = m.interleaved;
    a.ring_len = ring_len;
    a.cache_pos_offset = offset;
    a.rope = reinterpret_cast<const float2*>(dcs.get());
    a.rope_positions = n_pos;
    a.block_table = dt.get();
    a.start_pos = c.start;
    a.n_tokens = c.T;
    a.n_kv_heads = c.G;
    a.group_size = c.gs;
    a.head_dim = c.D;
    a.block_size = c.bs;
    a.eps = 1e-6f;
    a.q = q.get();
    a.k_cache = kc.get();
    a.v_cache = vc.get();
    qk_norm_rope_store(a, nullptr);
    const std::vector<float> gq = test::bf16_to_float(q.download());
    const std::vector<uint16_t> gk = kc.download(), gv = vc.download();
    std::vector<float> got;
    std::vector<double> want;
    std::vector<char> written(cache_elems, 0);
    for (int t = 0; t < c.T; ++t) {
      const int pos = c.start + t;
      for (int g = 0; g < c.G; ++g)
        for (int j = 0; j < c.gs + 2; ++j) {
          const float* src = qkv.data() + static_cast<size_t>(t) * rows + qkv_col(g, j, 0, c.gs, c.D);
          const int64_t kv_at = kv_offset(table[entry(pos)], g, (pos - offset) % c.bs, 0, c.G, c.bs, c.D);
          if (j == c.gs + 1) {  // V: stored as projected
            for (int d = 0; d < c.D; ++d) {
              got.push_back(bf16_bits_to_float(gv[kv_at + d]));
              want.push_back(src[d]);
              written[kv_at + d] = 1;
            }
            continue;
          }
          double ss = 0;
          for (int d = 0; d < c.D; ++d) ss += double(src[d]) * src[d];
          const double r = m.normed ? 1.0 / std::sqrt(ss / c.D + 1e-6) : 1.0;
          const std::vector<float>& w = j < c.gs ? qn.values : kn.values;
          std::vector<double> nrm(c.D);
          for (int d = 0; d < c.D; ++d) nrm[d] = src[d] * r * (m.normed ? w[d] : 1.0f);
          for (int d = 0; d < c.D; ++d) {
            // NeoX: d pairs with d +- D/2 at frequency d % (D/2); interleaved: d with d ^ 1 at d / 2.
            const int f = m.interleaved ? d / 2 : d % half, partner = m.interleaved ? d ^ 1 : (d < half ? d + half : d - half);
            const bool low = m.interleaved ? d % 2 == 0 : d < half;
            const double ang = double(static_cast<float>(pos) * inv[f]);
            const double y = !m.rope ? nrm[d]
                             : low   ? nrm[d] * std::cos(ang) - nrm[partner] * std::sin(ang)
                                     : nrm[d] * std::cos(ang) + nrm[partner] * std::sin(ang);
            want.push_back(y);
            if (j < c.gs) {
              got.push_back(gq[(static_cast<size_t>(t) * n_heads + g * c.gs + j) * c.D + d]);
            } else {
              got.push_back(bf16_bits_to_float(gk[kv_at + d]));
              written[kv_at + d] = 1;
            }
          }
        }
    }
    EXPECT_LE(worst_ratio(got, want, 1e-3), 1.0);
    int64_t stray = 0;
    for (size_t i = 0; i < cache_elems; ++i)
      if (!written[i]) stray += (gk[i] != 0xffff) + (gv[i] != 0xffff);
    EXPECT_EQ(stray, 0) << "K/V written outside the chunk's slots";
  }
}

TEST(PrefillNorm, EmbeddingMoeResidualAndAddMatchHost) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("PrefillNorm"));
  // 200: 50 chunks of 4 floats, most threads idle; 3076: 769 chunks, three a thread and a fourth for
  // thread 0.
  for (const int H : {200, 3076}) {
    SCOPED_TRACE(::testing::Message() << "hidden " << H);
    const int T = 37, V = 50, K = 3;
    const test::Bf16Data embed = test::random_bf16(static_cast<size_t>(V) * H, rng, 1.0f);
    const test::Bf16Data nw = test::random_bf16(H, rng, 2.0f);
    std::vector<int32_t> tokens(T), token_slot(T * K);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(V));
    std::iota(token_slot.begin(), token_slot.end(), 0);
    for (int i = T * K - 1; i > 0; --i) std::swap(token_slot[i], token_slot[rng.below(i + 1)]);
    std::vector<float> h(static_cast<size_t>(T) * H), down(static_cast<size_t>(T) * K * H), tw(T * K);
    for (float& v : h) v = 2.0f * rng.unit() - 1.0f;
    for (float& v : down) v = 2.0f * rng.unit() - 1.0f;
    for (float& v : tw) v = rng.unit();
    DeviceBuffer<uint16_t> d_embed(embed.bits), d_nw(nw.bits), out(static_cast<size_t>(T) * H);
    DeviceBuffer<int32_t> d_tok(tokens), d_ts(token_slot), err(1);
    DeviceBuffer<float> d_h(h), d_down(down), d_tw(tw), x(static_cast<size_t>(T) * H);
    // The add mode's second rows: the first T rows of `down`, summed into x in place.
    const std::vector<float> add(down.begin(), down.begin() + static_cast<size_t>(T) * H);
    // 0 embedding, 1 MoE residual, 2 MoE residual of the last token only, 3 add (x = h + x in place)
    for (int mode = 0; mode < 4; ++mode) {
      SCOPED_TRACE(::testing::Message() << "mode " << mode);
      out.poison();
      x.poison();
      if (mode == 3) x.upload(add);
      err.fill_bytes(0);
      ResidualNormArgs a;
      if (mode == 0) {
        a.tokens = d_tok.get();
        a.embed = d_embed.get();
        a.vocab = V;
      } else if (mode == 3) {
        a.h = d_h.get();
        a.add = x.get();
      } else {
        a.h = d_h.get();
        a.down = d_down.get();
        a.token_slot = d_ts.get();
        a.topk_w = d_tw.get();
        a.top_k = K;
      }
      a.token_begin = mode == 2 ? T - 1 : 0;
      a.n_tokens = T;
      a.hidden = H;
      a.norm_w = d_nw.get();
      a.eps = 1e-6f;
      a.x = x.get();
      a.out = out.get();
      a.error = err.get();
      residual_norm(a, nullptr);
      const std::vector<float> gx = x.download(), go = test::bf16_to_float(out.download());
      std::vector<float> got_x, got_o;
      int64_t add_mismatches = 0;
      std::vector<double> want_x, want_o;
      for (int t = a.token_begin; t < T; ++t) {
        std::vector<double> v(H);
        for (int i = 0; i < H; ++i) {
          if (mode == 0) {
            v[i] = embed.values[static_cast<size_t>(tokens[t]) * H + i];
          } else if (mode == 3) {
            // One fp32 addition, as the O-proj's residual epilogue made it: exact.
            const size_t e = static_cast<size_t>(t) * H + i;
            const float want = h[e] + add[e];
            if (std::memcmp(&want, &gx[e], 4) != 0) ++add_mismatches;
            v[i] = want;
          } else {
            double s = 0;
            for (int k = 0; k < K; ++k) s += double(tw[t * K + k]) * down[static_cast<size_t>(token_slot[t * K + k]) * H + i];
            v[i] = h[static_cast<size_t>(t) * H + i] + s;
          }
        }
        double ss = 0;
        for (double e : v) ss += e * e;
        const double r = 1.0 / std::sqrt(ss / H + 1e-6);
        for (int i = 0; i < H; ++i) {
          got_x.push_back(gx[static_cast<size_t>(t) * H + i]);
          want_x.push_back(v[i]);
          got_o.push_back(go[static_cast<size_t>(t - a.token_begin) * H + i]);
          want_o.push_back(v[i] * r * nw.values[i]);
        }
      }
      EXPECT_LE(worst_ratio(got_x, want_x, 1e-5), 1.0) << "residual stream x";
      EXPECT_LE(worst_ratio(got_o, want_o, 1e-3), 1.0) << "normed output";
      EXPECT_EQ(err.download()[0], 0);
      EXPECT_EQ(add_mismatches, 0) << "x = h + add must be the one fp32 addition";
    }
  }
}

TEST(PrefillNorm, HiddenNotAMultipleOfFourIsAnError) {
  ResidualNormArgs a;
  a.n_tokens = 1;
  a.hidden = 202;
  uint16_t w = 0, o = 0;
  a.norm_w = &w;
  a.out = &o;
  EXPECT_THROW(residual_norm(a, nullptr), Error);
}

TEST(PrefillNorm, AddModeWithoutItsDestinationIsAnError) {
  ResidualNormArgs a;
  a.n_tokens = 1;
  a.hidden = 200;
  uint16_t w = 0, o = 0;
  float h = 0, add = 0;
  a.norm_w = &w;
  a.out = &o;
  a.h = &h;
  a.add = &add;
  EXPECT_THROW(residual_norm(a, nullptr), Error);  // x (where h + add goes) is missing
}

}  // namespace
}  // namespace megadecode::cuda::prefill
