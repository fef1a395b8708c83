// The megakernel's GEMM jobs as plain index math (host and device, so tests/cuda/test_megakernel_jobs
// checks it on the CPU): a job multiplies 16-row blocks [rb_begin, rb_end) of a packed weight matrix
// (cuda/common/weight_pack.cuh) over k blocks [kb_off, kb_off + n_kb) by up to 64 activation rows.
// Its weights stream as pages, the loader and the consumers walking the same sequence:
//   page p = row-block group p / n_stages (page_rb row blocks), k stage p % n_stages (page_kb k
//   blocks); a page is at most kPageTiles fragment tiles (32 KB). Pages stack several row blocks
//   only when one holds the whole K (their tiles are then one contiguous range, one bulk copy).
// The activations live in shared memory (bf16 rows with a padded pitch), one window of k at a time:
// window w = k blocks [w * window_kb, (w + 1) * window_kb); window_kb is a multiple of page_kb, so a
// page never straddles two windows, and the consumers refill the window when the next page's
// differs (at batch <= 8 every job's K fits one window: one fill per job).
#pragma once

#include <cstdint>

#include "core/bf16.h"  // MD_HOST_DEVICE

namespace megadecode::cuda::mk {

constexpr int kTileBytes = 512;  // one 16 x 16 bf16 fragment tile
constexpr int kPageTiles = 64;   // tiles per page at most
constexpr int kPageBytes = kPageTiles * kTileBytes;
constexpr int kActPad = 8;       // bf16 elements of padding per activation row (conflict-free B loads)

struct PageGeo {
  int32_t page_rb;   // row blocks per page
  int32_t page_kb;   // k blocks per page
  int32_t n_groups;  // row-block groups
  int32_t n_stages;  // k stages per group
  MD_HOST_DEVICE int32_t n_pages() const { return n_groups * n_stages; }
};

// The largest d <= limit dividing n, a multiple of 8 when one exists (k blocks are dealt to the
// 8 consumer warps by kb % 8).
MD_HOST_DEVICE inline int32_t k_step(int32_t n, int32_t limit) {
  for (int32_t d = limit < n ? limit : n; d >= 1; --d)
    if (n % d == 0 && d % 8 == 0) return d;
  for (int32_t d = limit < n ? limit : n; d >= 1; --d)
    if (n % d == 0) return d;
  return 1;
}

// Pages of a job of n_rb row blocks x n_kb k blocks; at most max_page_rb row blocks (the
// consumers' accumulators) and max_page_kb k blocks (the activation window) per page.
MD_HOST_DEVICE inline PageGeo page_geo(int32_t n_rb, int32_t n_kb, int32_t max_page_rb, int32_t max_page_kb) {
  PageGeo g{};
  const int32_t kb_limit = max_page_kb < kPageTiles ? max_page_kb : kPageTiles;
  g.page_kb = k_step(n_kb, kb_limit);
  g.page_rb = 1;
  if (g.page_kb == n_kb) {
    int32_t r = kPageTiles / n_kb;
    if (r > max_page_rb) r = max_page_rb;
    if (r > n_rb) r = n_rb;
    g.page_rb = r < 1 ? 1 : r;
  }
  g.n_groups = (n_rb + g.page_rb - 1) / g.page_rb;
  g.n_stages = n_kb / g.page_kb;
  return g;
}

struct PageRef {
  int32_t rb0;   // first row block, relative to the job
  int32_t n_rb;  // row blocks (the group's last page may hold fewer)
  int32_t kb0;   // first k block, relative to the job
};
MD_HOST_DEVICE inline PageRef page_ref(const PageGeo& g, int32_t n_rb, int32_t p) {
  PageRef r{};
  const int32_t group = p / g.n_stages, stage = p % g.n_stages;
  r.rb0 = group * g.page_rb;
  r.n_rb = n_rb - r.rb0 < g.page_rb ? n_rb - r.rb0 : g.page_rb;
  r.kb0 = stage * g.page_kb;
  return r;
}

// Activation window of a job: k blocks per window given `rows` activation rows and `cap_bytes` of
// shared memory; 0 when not even one page's k fits (the caller then asks for smaller pages).
MD_HOST_DEVICE inline int32_t window_kb_fit(int32_t rows, int64_t cap_bytes) {
  const int64_t elems = cap_bytes / (2 * static_cast<int64_t>(rows > 0 ? rows : 1)) - kActPad;
  const int64_t kb = elems < 16 ? 0 : elems / 16;
  return static_cast<int32_t>(kb < (int64_t{1} << 30) ? kb : (int64_t{1} << 30));
}

// The job's pages and windows, both fitted to the shared memory: (geo, window_kb).
struct JobLayout {
  PageGeo geo;
  int32_t window_kb;  // a multiple of geo.page_kb, <= n_kb
  MD_HOST_DEVICE int32_t n_windows(int32_t n_kb) const { return (n_kb + window_kb - 1) / window_kb; }
};
MD_HOST_DEVICE inline JobLayout job_layout(int32_t n_rb, int32_t n_kb, int32_t max_page_rb, int32_t rows,
                                           int64_t cap_bytes) {
  JobLayout j{};
  int32_t fit = window_kb_fit(rows, cap_bytes);
  if (fit < 1) fit = 1;  // cannot happen for the shapes the planner accepts (checked on the host)
  j.geo = page_geo(n_rb, n_kb, max_page_rb, fit);
  const int32_t w = fit < n_kb ? fit : n_kb;
  j.window_kb = w / j.geo.page_kb * j.geo.page_kb;
  if (j.window_kb < j.geo.page_kb) j.window_kb = j.geo.page_kb;
  return j;
}

// Bytes of page p, and the element offset of its row block i (< n_rb) in the packed matrix
// (row-block stride n_kb_total tiles; the job's k range starts at kb_off).
MD_HOST_DEVICE inline int64_t page_bytes(const PageGeo& g, const PageRef& r) {
  return static_cast<int64_t>(r.n_rb) * g.page_kb * kTileBytes;
}
MD_HOST_DEVICE inline int64_t page_tile_offset(int32_t rb_abs, int32_t n_kb_total, int32_t kb_abs) {
  return (static_cast<int64_t>(rb_abs) * n_kb_total + kb_abs) * (kTileBytes / 2);
}

}  // namespace megadecode::cuda::mk
