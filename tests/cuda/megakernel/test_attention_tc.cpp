// Host tests of the tensor-core attention item's index math and formulas (cuda/megakernel/attention_geo.h),
// run on the CPU in CI: the per-chunk copy map against plain loops over random split geometries,
// a sliding layer's ring mapping against the reference's KV store (ref::KvStore::locate_ring),
// the MMA/ldmatrix fragment maps against the PTX layouts, and a lane-level emulation of the whole
// item (attention_item.cuh: cp.async groups with poisoned not-yet-landed bytes, ldmatrix, m16n8k16,
// quad shuffles, warp and split merges) against attention computed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "attention_tc_emu.h"
#include "core/rng.h"
#include "cuda/megakernel/attention_geo.h"
#include "kv/kv_cache.h"
#include "plan/planner.h"
#include "plan/policy.h"
#include "ref/kv_store.h"

namespace megadecode::cuda::mk {
namespace {

// Random geometry: a sequence's block table over a shuffled pool and its planned splits.
struct SeqGeo {
  int G, group, bs, D, n;
  std::vector<int32_t> bt;
  AttnSplit split;
};

SeqGeo random_geo(SplitMix64& rng, int max_ctx) {
  SeqGeo s;
  s.G = 1 + static_cast<int>(rng.below(4));
  s.group = static_cast<int>(rng.below(s.G));
  const int bss[] = {1, 2, 16, 32};  // powers of two (the megakernel's index math shifts)
  s.bs = bss[rng.below(4)];
  s.D = 16 << rng.below(4);        // 16, 32, 64, 128
  s.n = 1 + static_cast<int>(rng.below(max_ctx));
  const int blocks = (s.n + s.bs - 1) / s.bs;
  std::vector<int32_t> perm(blocks * 3);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  s.bt.assign(perm.begin(), perm.begin() + blocks);
  Policy p;
  const int mins[] = {1, 16, 48, 256};
  p.attn_min_split_tokens = mins[rng.below(4)];
  p.attn_max_splits = 1 + static_cast<int>(rng.below(64));
  s.split = attn_split_for(s.n, p, s.bs);
  return s;
}

AttnGeo item_geo(const SeqGeo& s, int split) {
  const int b = split * s.split.len, e = std::min(s.n, (split + 1) * s.split.len);
  return AttnGeo{s.bt.data(), s.G, s.group, s.bs, s.D, b, e, s.n - 1};
}

// Piece idx in [0, kAttnRows * D / 8) of a chunk's stage: its row (token of the chunk) and 16-byte column.
struct AttnPiece {
  int row, ch;
};
AttnPiece attn_piece(int idx, int D) { return {idx / (D / 8), idx % (D / 8)}; }

// The device's per-lane walk (attn_lane_pieces) is attn_piece(lane + 32 i), i = 0, 1, ...
TEST(AttnTcGeo, LanePiecesAreThePieceWalk) {
  for (int D : {16, 32, 64, 128}) {
    std::vector<int> seen(kAttnRows * (D / 8), 0);
    for (int lane = 0; lane < 32; ++lane) {
      const AttnLanePieces lp = attn_lane_pieces(lane, D);
      int i = 0;
      for (int row = lp.row0; row < kAttnRows; row += lp.step, ++i) {
        const AttnPiece pc = attn_piece(lane + 32 * i, D);
        ASSERT_EQ(pc.row, row) << "D " << D << " lane " << lane << " i " << i;
        ASSERT_EQ(pc.ch, lp.ch) << "D " << D << " lane " << lane << " i " << i;
        ++seen[row * (D / 8) + lp.ch];
      }
      EXPECT_EQ(lane + 32 * i >= kAttnRows * (D / 8), true) << "D " << D << " lane " << lane << ": pieces left over";
    }
    for (size_t k = 0; k < seen.size(); ++k) EXPECT_EQ(seen[k], 1) << "D " << D << " piece " << k;
  }
}

TEST(AttnTcGeo, ChunkCopiesCoverEachKeyOnceAndNothingElse) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces)\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const SeqGeo s = random_geo(rng, trial % 3 == 0 ? 4100 : 300);
    int covered_end = 0, n_patch = 0;
    for (int sp = 0; sp < s.split.n_splits; ++sp) {
      const AttnGeo g = item_geo(s, sp);
      ASSERT_EQ(g.pos_begin, covered_end) << "trial " << trial << " split " << sp;
      ASSERT_LT(g.pos_begin, g.pos_end) << "empty split " << sp << " of " << s.split.n_splits << ", n " << s.n;
      covered_end = g.pos_end;
      // count[tok - pos_begin][ch]: how often each 16-byte piece of each key is copied.
      std::vector<int> count((g.pos_end - g.pos_begin) * (s.D / 8), 0);
      const int n_chunks = attn_n_chunks(g.pos_begin, g.pos_end);
      ASSERT_EQ(n_chunks * kAttnRows >= g.pos_end - g.pos_begin, true);
      ASSERT_LT((n_chunks - 1) * kAttnRows, g.pos_end - g.pos_begin);
      for (int c = 0; c < n_chunks; ++c) {
        for (int idx = 0; idx < kAttnRows * (s.D / 8); ++idx) {
          const AttnPiece pc = attn_piece(idx, s.D);
          ASSERT_TRUE(pc.row >= 0 && pc.row < kAttnRows && pc.ch >= 0 && pc.ch < s.D / 8);
          const int tok = g.token(c, pc.row);
          ASSERT_EQ(tok, g.pos_begin + c * 16 + pc.row);
          if (!g.copied(tok)) {
            EXPECT_TRUE(tok >= g.pos_end || tok == s.n - 1) << "key " << tok << " of [" << g.pos_begin << ", "
                                                            << g.pos_end << ") not loaded";
            continue;
          }
          ASSERT_TRUE(tok >= g.pos_begin && tok < g.pos_end);
          const int64_t want = ((static_cast<int64_t>(s.bt[tok / s.bs]) * s.G + s.group) * s.bs + tok % s.bs) * s.D;
          ASSERT_EQ(g.at(tok), want);
          ++count[(tok - g.pos_begin) * (s.D / 8) + pc.ch];
        }
        const int r = g.patch_row(c);
        if (r >= 0) {
          ++n_patch;
          EXPECT_EQ(g.token(c, r), s.n - 1);
          EXPECT_EQ(g.pos_end, s.n) << "only the appending split holds the new token";
        }
      }
      for (int tok = g.pos_begin; tok < g.pos_end; ++tok)
        for (int ch = 0; ch < s.D / 8; ++ch)
          EXPECT_EQ(count[(tok - g.pos_begin) * (s.D / 8) + ch], tok == s.n - 1 ? 0 : 1) << "key " << tok;
    }
    EXPECT_EQ(covered_end, s.n) << "splits do not cover the context";
    EXPECT_EQ(n_patch, 1) << "the new token must be patched exactly once, trial " << trial;
  }
}

// A sliding layer's item (ring_len > 0) finds position pos where the reference's KV store keeps it:
// ring block ring_table[(pos / B) % R], slot pos % B, over contexts that wrap the ring many times;
// and the window's positions never share a row (no key is overwritten while the window reads it).
TEST(AttnTcGeo, RingRowsAreTheKvStoresRingSlots) {
  SplitMix64 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    const int bss[] = {1, 2, 16, 32};
    const int bs = bss[rng.below(4)];
    const int W = 1 + static_cast<int>(rng.below(bs * 4 + 40));
    const int G = 1 + static_cast<int>(rng.below(4)), group = static_cast<int>(rng.below(G));
    const int D = 16 << rng.below(4);
    ModelConfig c;
    c.model_type = "cohere2_moe";
    c.n_layers = 2;
    c.n_heads = G;
    c.n_kv_heads = G;
    c.head_dim = D;
    c.layers = {LayerSpec{W, true, FfnKind::kMoe}, LayerSpec{0, false, FfnKind::kMoe}};
    const int R = kv_ring_length(W, bs);
    const int n_ring_blocks = R + static_cast<int>(rng.below(3 * R));
    const ref::KvStore kv(c, bs, 1, n_ring_blocks);
    ASSERT_EQ(kv.ring_length(), R);
    ASSERT_TRUE(kv.in_ring(0));
    std::vector<int32_t> pool(n_ring_blocks);
    for (int i = 0; i < n_ring_blocks; ++i) pool[i] = i;
    for (int i = n_ring_blocks - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
    const std::vector<int32_t> ring(pool.begin(), pool.begin() + R);
    const int n = 1 + static_cast<int>(rng.below(8 * R * bs + 8));  // the context after this step
    const int pos_begin = std::max(0, n - W);
    const AttnGeo g{ring.data(), G, group, bs, D, pos_begin, n, n - 1, R};
    std::vector<int64_t> rows;
    for (int pos = pos_begin; pos < n; ++pos) {
      // The table a sequence at this context holds: min(R, blocks covering it) entries.
      const size_t held = std::min<size_t>(R, static_cast<size_t>(n + bs - 1) / bs);
      const ref::KvStore::Slot sl = kv.locate_ring({ring.data(), held}, pos);
      const int64_t want = ((static_cast<int64_t>(sl.block) * G + group) * bs + sl.slot) * D;
      ASSERT_EQ(g.at(pos), want) << "pos " << pos << " W " << W << " bs " << bs << " R " << R;
      ASSERT_LT(g.table_index(pos), static_cast<int>(held));
      rows.push_back(want);
    }
    std::sort(rows.begin(), rows.end());
    EXPECT_TRUE(std::adjacent_find(rows.begin(), rows.end()) == rows.end()) << "W " << W << " bs " << bs;
  }
}

// ring_len 0 is the block table itself (qwen3_moe's items): the same rows as before rings.
TEST(AttnTcGeo, NoRingIsTheBlockTable) {
  SplitMix64 rng(32);
  for (int trial = 0; trial < 50; ++trial) {
    const SeqGeo s = random_geo(rng, 4000);
    const AttnGeo g = item_geo(s, 0);
    ASSERT_EQ(g.ring_len, 0);
    for (int pos = 0; pos < s.n; ++pos)
      ASSERT_EQ(g.at(pos), ((static_cast<int64_t>(s.bt[pos / s.bs]) * s.G + s.group) * s.bs + pos % s.bs) * s.D);
  }
}

TEST(AttnTcGeo, FragmentMapsFollowThePtxLayouts) {
  for (int kc = 0; kc < kAttnMaxDim / 16; ++kc) {
    std::vector<int> a(16 * 16, 0);
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r) {
        const AttnRC rc = attn_qfrag_coord(lane, r, kc);
        // PTX m16n8k16 A: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8), pairs (k, k+1)
        EXPECT_EQ(rc.row, lane / 4 + 8 * (r % 2));
        EXPECT_EQ(rc.col - kc * 16, 2 * (lane % 4) + 8 * (r / 2));
        ++a[rc.row * 16 + rc.col - kc * 16];
        ++a[rc.row * 16 + rc.col + 1 - kc * 16];
      }
    for (int v : a) EXPECT_EQ(v, 1);
  }
  std::vector<int> sc(16 * 16, 0), oc(16 * kAttnMaxDim, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      for (int nn = 0; nn < 2; ++nn) ++sc[attn_score_coord(lane, nn, e).row * 16 + attn_score_coord(lane, nn, e).col];
      for (int dn = 0; dn < kAttnMaxDim / 8; ++dn)
        ++oc[attn_out_coord(lane, dn, e).row * kAttnMaxDim + attn_out_coord(lane, dn, e).col];
    }
  for (int v : sc) EXPECT_EQ(v, 1);
  for (int v : oc) EXPECT_EQ(v, 1);
  // ldmatrix row addresses: 16-byte aligned rows, each (row, 8-column block) of the operand once.
  for (int kc = 0; kc < kAttnMaxDim / 16; ++kc) {
    std::vector<int> seen(16 * 2, 0);
    for (int lane = 0; lane < 32; ++lane) {
      const AttnRC k = attn_k_ldm(lane, kc);
      EXPECT_EQ((k.row * kAttnPitch + k.col * 2) % 16, 0);
      ++seen[k.row * 2 + (k.col - kc * 16) / 8];
    }
    for (int v : seen) EXPECT_EQ(v, 1);
  }
  for (int dn = 0; dn < kAttnMaxDim / 8; dn += 2) {
    std::vector<int> seen(16 * 2, 0);
    for (int lane = 0; lane < 32; ++lane) {
      const AttnRC v = attn_v_ldm(lane, dn);
      EXPECT_EQ((v.row * kAttnPitch + v.col * 2) % 16, 0);
      ++seen[v.row * 2 + (v.col - dn * 8) / 8];
    }
    for (int v : seen) EXPECT_EQ(v, 1);
  }
}

TEST(AttnTcGeo, TermsSplitExactly) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    const float x = (2.0f * rng.unit() - 1.0f) * std::ldexp(1.0f, static_cast<int>(rng.below(40)) - 20);
    uint16_t t[kAttnMaxTerms];
    attn_split_terms(x, 3, t);
    const double sum3 = static_cast<double>(bf16_bits_to_float(t[0])) + bf16_bits_to_float(t[1]) + bf16_bits_to_float(t[2]);
    EXPECT_LE(std::fabs(sum3 - x), std::fabs(x) * std::ldexp(1.0, -24)) << x;
    attn_split_terms(x, 2, t);
    EXPECT_EQ(t[2], 0);
    const double sum2 = static_cast<double>(bf16_bits_to_float(t[0])) + bf16_bits_to_float(t[1]);
    EXPECT_LE(std::fabs(sum2 - x), std::fabs(x) * std::ldexp(1.0, -16)) << x;
  }
}

// The whole item, lane by lane, against double attention: every split of random sequences.
TEST(AttnTcEmulation, MatchesDoubleAttentionOverRandomSplits) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces)\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  EmuStats st3, st2, st_fp32;
  for (int trial = 0; trial < 40; ++trial) {
    const SeqGeo s = random_geo(rng, trial % 4 == 0 ? 2100 : 400);
    const int gs = 1 + static_cast<int>(rng.below(kAttnMaxGroup));
    EmuCase k = make_emu_case(rng, s.G, s.group, s.bs, s.D, gs, s.n, s.bt);
    std::vector<AttnGeo> items;
    for (int sp = 0; sp < s.split.n_splits; ++sp) items.push_back(item_geo(s, sp));
    const std::vector<double> ref = emu_reference<double>(k);
    for (int terms : {3, 2}) {
      const std::vector<float> out = emu_tc_attention(k, items, terms);
      EmuStats& st = terms == 3 ? st3 : st2;
      accumulate_stats(out, ref, st);
      for (float v : out) ASSERT_TRUE(std::isfinite(v)) << "trial " << trial << ": a poisoned (unlanded) byte was read";
    }
    accumulate_stats(emu_reference<float>(k), ref, st_fp32);
    ASSERT_LE(st3.max_rel, 3e-5) << "trial " << trial << " n " << s.n << " D " << s.D << " gs " << gs << " splits "
                                 << s.split.n_splits << " x " << s.split.len;
  }
  std::printf("max |err| / max |ref| (fp32 outputs): tc3 %.3g, tc2 %.3g, plain fp32 %.3g\n", st3.max_rel, st2.max_rel,
              st_fp32.max_rel);
  std::printf("bf16 outputs that differ from bf16(double): tc3 %lld, tc2 %lld, plain fp32 %lld of %lld\n",
              static_cast<long long>(st3.bf16_flips), static_cast<long long>(st2.bf16_flips),
              static_cast<long long>(st_fp32.bf16_flips), static_cast<long long>(st3.n));
  EXPECT_LE(st2.max_rel, 1e-3);  // 2 terms: ~16 bits, still far from a wrong key (an index bug)
  // 3 terms round like plain fp32 arithmetic (no more bf16 flips than it, within noise); 2 terms
  // flip 5-10x more outputs (what the ragged-batch GPU test's routing is sensitive to).
  EXPECT_LE(st3.bf16_flips, 2 * st_fp32.bf16_flips + 16);
  EXPECT_LT(st3.bf16_flips, st2.bf16_flips);
}

}  // namespace
}  // namespace megadecode::cuda::mk
