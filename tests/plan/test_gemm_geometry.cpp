// The megakernel's GEMM geometry (plan/gemm_geometry.h): the page walk of a job covers
// every (row block, k block) exactly once, row-block group by group with the k stages in order,
// each page at most 32 KB and one contiguous copy when it stacks row blocks; activation windows are
// whole pages that fit the shared memory they are given, and every page lies in one window.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "plan/gemm_geometry.h"

namespace megadecode {
namespace {

TEST(MegakernelJobs, KStepIsTheLargestDivisorPreferringMultiplesOf8) {
  EXPECT_EQ(k_step(128, 64), 64);
  EXPECT_EQ(k_step(256, 64), 64);
  EXPECT_EQ(k_step(48, 64), 48);
  EXPECT_EQ(k_step(96, 64), 48);
  EXPECT_EQ(k_step(8, 64), 8);
  EXPECT_EQ(k_step(4, 64), 4);    // no multiple of 8 divides 4
  EXPECT_EQ(k_step(100, 64), 50); // none of 100's divisors <= 64 is a multiple of 8
  EXPECT_EQ(k_step(128, 20), 16);
  EXPECT_EQ(k_step(7, 64), 7);
}

// Every page of a job of n_rb row blocks, checked against a plain walk of its (row block, k block) grid.
void check_job(int n_rb, int n_kb, int max_page_rb, int rows, int64_t cap) {
  const GemmGeo g = gemm_geo(n_kb, max_page_rb, rows, cap);
  const std::string what = "n_rb " + std::to_string(n_rb) + " n_kb " + std::to_string(n_kb) + " max_rb " +
                           std::to_string(max_page_rb) + " rows " + std::to_string(rows) + " cap " + std::to_string(cap);
  ASSERT_EQ(g.n_kb, n_kb) << what;
  ASSERT_GE(g.page_kb, 1) << what;
  ASSERT_EQ(n_kb % g.page_kb, 0) << what;
  ASSERT_TRUE(g.page_rb >= 1 && g.page_rb <= max_page_rb) << what;
  ASSERT_TRUE(g.page_rb == 1 || g.page_kb == n_kb) << what << ": only whole-K pages stack row blocks";
  ASSERT_LE(g.page_rb * g.page_kb, kPageTiles) << what;
  ASSERT_EQ(g.window_kb % g.page_kb, 0) << what;
  ASSERT_LE(g.window_kb, n_kb) << what;
  ASSERT_EQ(g.pitch, g.window_kb * 16 + kActPad) << what;
  ASSERT_EQ(g.n_windows(), (n_kb + g.window_kb - 1) / g.window_kb) << what;
  if (window_kb_fit(rows, cap) >= g.page_kb) {  // the window fits the area (pitch = window + padding)
    EXPECT_LE(static_cast<int64_t>(g.pitch) * 2 * rows, cap) << what;
  }
  std::vector<int> seen(static_cast<size_t>(n_rb) * n_kb, 0);
  int last_rb0 = -1, last_kb_end = 0, n_pages = 0;
  const bool whole = walk_pages(g, n_rb, [&](int rb0, int nrb, int kb0) {
    ++n_pages;
    EXPECT_TRUE(nrb >= 1 && nrb <= g.page_rb && rb0 + nrb <= n_rb) << what;
    EXPECT_LE(static_cast<int64_t>(nrb) * g.page_kb * kTileBytes, kPageBytes) << what;
    EXPECT_EQ(kb0 / g.window_kb, (kb0 + g.page_kb - 1) / g.window_kb) << what << ": a page straddles two windows";
    // Group by group, a group's k stages in order.
    if (rb0 != last_rb0) {
      EXPECT_EQ(last_kb_end, last_rb0 < 0 ? 0 : n_kb) << what;
      EXPECT_EQ(kb0, 0) << what;
      EXPECT_EQ(rb0, last_rb0 < 0 ? 0 : last_rb0 + g.page_rb) << what;
      last_rb0 = rb0;
    } else {
      EXPECT_EQ(kb0, last_kb_end) << what;
    }
    last_kb_end = kb0 + g.page_kb;
    for (int m = 0; m < nrb; ++m)
      for (int k = 0; k < g.page_kb; ++k) ++seen[static_cast<size_t>(rb0 + m) * n_kb + kb0 + k];
    // A stacked page is one contiguous range of the packed matrix: row block i's tiles right after i-1's.
    if (nrb > 1) {
      EXPECT_EQ(tile_offset(rb0 + 1, n_kb, 0) - tile_offset(rb0, n_kb, 0), static_cast<int64_t>(n_kb) * kTileElems)
          << what;
    }
    return true;
  });
  EXPECT_TRUE(whole) << what;
  EXPECT_EQ(n_pages, (n_rb + g.page_rb - 1) / g.page_rb * (n_kb / g.page_kb)) << what;
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << what << ": tile " << i;
}

TEST(MegakernelJobs, PagesCoverEveryTileOnceInOrder) {
  // The decode shapes: QKV/router/LM head (K 2048), O-proj (K 4096), expert up (K 2048, units of
  // one row block), expert down (K 768, one row block), tiny's K 128 and 64.
  for (int rows : {1, 8, 16, 64})
    for (int n_kb : {128, 256, 48, 8, 4})
      for (int n_rb : {1, 2, 3, 5, 72})
        for (int max_rb : {1, 2, 4}) check_job(n_rb, n_kb, max_rb, rows, 83 << 10);
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int i = 0; i < 500; ++i)
    check_job(1 + static_cast<int>(rng.below(40)), 1 + static_cast<int>(rng.below(300)), 1 + static_cast<int>(rng.below(4)),
              1 + static_cast<int>(rng.below(64)), (4 + static_cast<int64_t>(rng.below(200))) << 10);
}

TEST(MegakernelJobs, WalkStopsWhenAsked) {
  const GemmGeo g = gemm_geo(128, 4, 1, 83 << 10);
  int calls = 0;
  EXPECT_FALSE(walk_pages(g, 5, [&](int, int, int) { return ++calls < 3; }));
  EXPECT_EQ(calls, 3);
}

TEST(MegakernelJobs, WindowsFollowTheActivationArea) {
  // Batch 1 and 8 hold the whole K of every decode GEMM in one window (83 KB area).
  for (int rows : {1, 8}) {
    EXPECT_EQ(gemm_geo(128, 4, rows, 83 << 10).window_kb, 128);
    EXPECT_EQ(gemm_geo(256, 4, rows, 83 << 10).window_kb, 256);
  }
  // Batch 64 at K 4096: 64 rows of (window + 8) bf16 in 64 KB: a 504-element window -> 31
  // k blocks -> pages of the largest multiple-of-8 divisor of 256 that fits (16), windows of 16.
  const GemmGeo big = gemm_geo(256, 1, 64, 64 << 10);
  EXPECT_EQ(big.page_kb, 16);
  EXPECT_EQ(big.window_kb, 16);
  EXPECT_EQ(big.n_windows(), 16);
  // With the whole K asked for (the expert-down jobs fill their rows themselves): one window.
  EXPECT_EQ(gemm_geo(48, 4, 1, int64_t{1} << 40).window_kb, 48);
  // Pages stack row blocks only when one row block's K is a whole page or less.
  EXPECT_EQ(gemm_geo(48, 4, 1, int64_t{1} << 40).page_rb, 1);
  EXPECT_EQ(gemm_geo(8, 4, 1, 83 << 10).page_rb, 4);
  EXPECT_EQ(gemm_geo(16, 4, 1, 83 << 10).page_rb, 4);
  EXPECT_EQ(gemm_geo(128, 4, 1, 83 << 10).page_rb, 1);
}

// The step geometry of the qwen3-30b-a3b shape on the kernel's layouts: one window for every
// GEMM at batch <= 16 but O-proj's K 4096 at 16; at 32 and 64 the hidden-K GEMMs take 4 and 8
// windows (of one page each) and O-proj 8 and 16; the expert-down jobs always hold the whole K.
TEST(MegakernelJobs, DecodeShapeWindowsAtEachBatch) {
  PlanShape s{};
  s.hidden = 2048;
  s.n_heads = 32;
  s.head_dim = 128;
  s.moe_inter = 768;
  EXPECT_EQ(token_groups(1), 1);
  EXPECT_EQ(token_groups(9), 2);
  EXPECT_EQ(token_groups(17), 4);
  EXPECT_EQ(token_groups(64), 8);
  struct Want {
    int batch, hidden_windows, oproj_windows, hidden_page_kb;
  };
  for (const Want w : {Want{1, 1, 1, 64}, Want{8, 1, 1, 64}, Want{16, 1, 2, 64}, Want{32, 4, 8, 32}, Want{64, 8, 16, 16}}) {
    SCOPED_TRACE(cat("batch ", w.batch));
    s.batch = w.batch;
    GemmGeo geo[kNumGemmKinds];
    gemm_geometry(s, megakernel_layout(token_groups(w.batch)), geo);
    for (GemmKind k : {kGemmQkv, kGemmRouter, kGemmLmHead, kGemmUp, kGemmDenseUp}) {
      EXPECT_EQ(geo[k].n_windows(), w.hidden_windows) << k;
      EXPECT_EQ(geo[k].page_kb, w.hidden_page_kb) << k;
      EXPECT_EQ(geo[k].window_kb, w.hidden_windows > 1 ? w.hidden_page_kb : 128) << k;
    }
    EXPECT_EQ(geo[kGemmOProj].n_windows(), w.oproj_windows);
    EXPECT_EQ(geo[kGemmDown].n_windows(), 1);
    EXPECT_EQ(geo[kGemmDown].window_kb, 48);
  }
  EXPECT_EQ(gemm_kind(Op::kQkv), kGemmQkv);
  EXPECT_EQ(gemm_kind(Op::kOProj), kGemmOProj);
  EXPECT_EQ(gemm_kind(Op::kRouter), kGemmRouter);
  EXPECT_EQ(gemm_kind(Op::kLmHead), kGemmLmHead);
  EXPECT_EQ(gemm_kind(Op::kExpertUp), kGemmUp);
  EXPECT_EQ(gemm_kind(Op::kExpertDown), kGemmDown);
  EXPECT_EQ(gemm_kind(Op::kDenseUp), kGemmDenseUp);
  EXPECT_EQ(gemm_kind(Op::kDenseDown), kGemmDenseDown);
  // A dense FFN's down: O-proj's geometry over K = dense_inter, windows of the batch's rows.
  s.batch = 8;
  s.parallel = 1;
  s.dense_inter = 6144;
  GemmGeo geo[kNumGemmKinds];
  gemm_geometry(s, megakernel_layout(1), geo);
  EXPECT_EQ(geo[kGemmDenseDown].n_kb, 6144 / 16);
  EXPECT_EQ(geo[kGemmDenseDown].n_kb % geo[kGemmDenseDown].page_kb, 0);
  EXPECT_EQ(geo[kGemmDenseDown].window_kb % geo[kGemmDenseDown].page_kb, 0);
  EXPECT_LE(int64_t{8} * geo[kGemmDenseDown].pitch * 2, megakernel_layout(1).act_bytes);
}

// The expert-down walk on random routings, some experts with more tokens than the area holds:
// every (row block, slot) is one job's exactly once, in row-block then expert then slot order,
// each job at most rows_cap slots of one expert; the activation groups the consumers form hold
// every job's slots within rows_cap rows, and a group starts only where the area lacks a job's
// slots. (The kernel at 64 tokens: 42 rows; an expert can take all 64 tokens.)
TEST(MegakernelJobs, DownWalkChunksExpertsToTheAreaAndGroupsTheRest) {
  const uint64_t seed = test_seed();
  SplitMix64 rng(seed);
  for (int round = 0; round < 300; ++round) {
    const int n_active = 1 + static_cast<int>(rng.below(20)), cap = 1 + static_cast<int>(rng.below(50));
    const int rb_begin = static_cast<int>(rng.below(5)), rb_end = rb_begin + static_cast<int>(rng.below(4));
    std::vector<int32_t> count(n_active), end(n_active);
    for (int i = 0, slot = 0; i < n_active; ++i) {
      count[i] = 1 + static_cast<int32_t>(rng.below(rng.below(3) == 0 ? 130 : 6));
      end[i] = slot += count[i];
    }
    const std::string what = cat("seed ", seed, " round ", round, ": ", n_active, " experts, cap ", cap);
    std::vector<int> seen(static_cast<size_t>(rb_end) * end.back(), 0);
    int32_t rb = rb_begin, ei = 0, tok = 0, s0 = 0, s1 = 0, last_rb = rb_begin, last_slot = -1, fills = 0;
    DownJob job;
    while (down_walk_next(rb, ei, tok, rb_end, n_active, cap, [&](int32_t i) { return count[i]; }, job)) {
      ASSERT_TRUE(job.rb >= rb_begin && job.rb < rb_end) << what;
      ASSERT_TRUE(job.n_tok >= 1 && job.n_tok <= cap && job.tok0 + job.n_tok <= count[job.ei]) << what;
      const int32_t j0 = (job.ei > 0 ? end[job.ei - 1] : 0) + job.tok0, j1 = j0 + job.n_tok;
      if (job.rb != last_rb) {
        ASSERT_EQ(job.rb, last_rb + 1) << what;
        ASSERT_EQ(last_slot, end.back()) << what << ": the row block before ended early";
        last_rb = job.rb;
        last_slot = 0;
      }
      ASSERT_EQ(j0, last_slot < 0 ? 0 : last_slot) << what << ": slots in order";
      last_slot = j1;
      ASSERT_EQ(rb != job.rb, j1 == end.back()) << what << ": rb moves on after the row block's last job only";
      for (int32_t q = j0; q < j1; ++q) ++seen[static_cast<size_t>(job.rb) * end.back() + q];
      if (j0 < s0 || j1 > s1) {
        s0 = j0;
        s1 = down_group_end([&](int32_t i) { return end[i]; }, n_active, job.ei + 1, j0, j1, cap);
        ++fills;
        ASSERT_LE(s1 - s0, cap) << what;
        ASSERT_GE(s1, j1) << what;
        // Every expert the group holds beyond the job's is whole.
        for (int i = job.ei + 1; i < n_active && end[i] <= s1; ++i) ASSERT_GE(s1, end[i]);
      }
      ASSERT_TRUE(j0 >= s0 && j1 <= s1) << what;
    }
    for (int r = rb_begin; r < rb_end; ++r)
      for (int q = 0; q < end.back(); ++q) ASSERT_EQ(seen[static_cast<size_t>(r) * end.back() + q], 1) << what;
    if (rb_end > rb_begin) {
      ASSERT_EQ(last_slot, end.back()) << what;
      ASSERT_GE(fills, (end.back() + cap - 1) / cap) << what;
    }
  }
}

}  // namespace
}  // namespace megadecode
