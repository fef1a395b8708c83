// The megakernel's GEMM geometry as plain index math, on the host and the device: the kernel
// (cuda/megakernel) walks it, the timing model (plan/simulate*) counts its pages and activation
// fills, and tests/plan/test_gemm_geometry checks it. A job multiplies 16-row blocks
// [rb_begin, rb_end) of a packed weight matrix (cuda/common/weight_pack.cuh) over all its n_kb k
// blocks by up to 64 activation rows. Its weights stream as pages, the loader and the consumers
// walking the same sequence with the same two loops (no division on the device):
//   for rb0 = 0, page_rb, 2 page_rb, ... < n_rb:        a row-block group (the last may be short)
//     for kb0 = 0, page_kb, ... < n_kb:                 one page: the group's k blocks [kb0, kb0 + page_kb)
// A page is at most kPageTiles fragment tiles (32 KB); pages stack several row blocks only when one
// holds the whole K (their tiles are then one contiguous range, one bulk copy).
// The activations live in shared memory (bf16 rows with a padded pitch), one window of k at a time:
// window w = k blocks [w * window_kb, (w + 1) * window_kb); window_kb is a multiple of page_kb, so a
// page never straddles two windows (at batch <= 8 every decode GEMM's K fits one window).
// The geometry of every GEMM kind of a step is computed once on the host (GemmGeo, in the kernel
// parameters): the device reads it and never divides.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "plan/task.h"  // PlanShape

namespace megadecode {

constexpr int kTileBytes = 512;  // one 16 x 16 bf16 fragment tile
constexpr int kTileElems = kTileBytes / 2;
constexpr int kPageTiles = 64;   // tiles per page at most
constexpr int kPageBytes = kPageTiles * kTileBytes;
constexpr int kActPad = 8;       // bf16 elements of padding per activation row (conflict-free B loads)

// The GEMM kinds of the decode step; each has one geometry per step. The dense FFN's (parallel
// blocks' dense layers) come last, so the others keep their numbers.
enum GemmKind : int32_t {
  kGemmQkv,
  kGemmOProj,
  kGemmRouter,
  kGemmLmHead,
  kGemmUp,
  kGemmDown,
  kGemmDenseUp,
  kGemmDenseDown,
  kNumGemmKinds
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

// Activation window of a job: k blocks per window given `rows` activation rows and `cap_bytes` of
// shared memory; 0 when not even one k block fits.
MD_HOST_DEVICE inline int32_t window_kb_fit(int32_t rows, int64_t cap_bytes) {
  const int64_t elems = cap_bytes / (2 * static_cast<int64_t>(rows > 0 ? rows : 1)) - kActPad;
  const int64_t kb = elems < 16 ? 0 : elems / 16;
  return static_cast<int32_t>(kb < (int64_t{1} << 30) ? kb : (int64_t{1} << 30));
}

// Pages and activation windows of one GEMM kind (a matrix of n_kb k blocks per row block).
struct GemmGeo {
  int32_t n_kb;       // k blocks of the matrix = its row-block stride in tiles
  int32_t page_rb;    // row blocks per page group (> 1 only when page_kb == n_kb)
  int32_t page_kb;    // k blocks per page, divides n_kb
  int32_t window_kb;  // k blocks per activation window: a multiple of page_kb, <= n_kb
  int32_t pitch;      // elements per activation row in shared memory: window_kb * 16 + kActPad
  int32_t rows_cap;   // rows of one window the step's activation area holds (gemm_geometry)
  int32_t pad[2];
  MD_HOST_DEVICE int32_t n_windows() const { return (n_kb + window_kb - 1) / window_kb; }
};
static_assert(sizeof(GemmGeo) == 32);

// The geometry for a matrix of n_kb k blocks: pages of at most max_page_rb row blocks (the
// consumers' accumulators), activation windows of `rows` rows in `cap_bytes` of shared memory.
MD_HOST_DEVICE inline GemmGeo gemm_geo(int32_t n_kb, int32_t max_page_rb, int32_t rows, int64_t cap_bytes) {
  GemmGeo g{};
  int32_t fit = window_kb_fit(rows, cap_bytes);
  if (fit < 1) fit = 1;  // cannot happen for the shapes the host accepts (checked there)
  g.n_kb = n_kb;
  g.page_kb = k_step(n_kb, fit < kPageTiles ? fit : kPageTiles);
  g.page_rb = 1;
  if (g.page_kb == n_kb) {
    const int32_t r = kPageTiles / n_kb;
    g.page_rb = r < 1 ? 1 : (r > max_page_rb ? max_page_rb : r);
  }
  const int32_t w = fit < n_kb ? fit : n_kb;
  g.window_kb = w / g.page_kb * g.page_kb;
  if (g.window_kb < g.page_kb) g.window_kb = g.page_kb;
  g.pitch = g.window_kb * 16 + kActPad;
  return g;
}

// The GEMM kind of a GEMM op (SAMPLE and ATTN have none: LM_HEAD's is returned).
MD_HOST_DEVICE inline GemmKind gemm_kind(Op op) {
  switch (op) {
    case Op::kQkv: return kGemmQkv;
    case Op::kOProj: return kGemmOProj;
    case Op::kRouter: return kGemmRouter;
    case Op::kExpertUp: return kGemmUp;
    case Op::kExpertDown: return kGemmDown;
    case Op::kDenseUp: return kGemmDenseUp;
    case Op::kDenseDown: return kGemmDenseDown;
    default: return kGemmLmHead;
  }
}

// What the geometry takes from the kernel's shared-memory layout at one instantiation: the bytes
// of its activation area and the row blocks a page may stack (the consumers' accumulators).
struct GemmLayout {
  int64_t act_bytes;
  int32_t page_rb_max;
};

// The megakernel's instantiations: kNT = 1, 2, 4, 8 token groups of 8 (batch <= 8, 16, 32, 64).
MD_HOST_DEVICE inline int32_t token_groups(int32_t batch) { return batch <= 8 ? 1 : batch <= 16 ? 2 : batch <= 32 ? 4 : 8; }

// The layout of each instantiation as cuda/megakernel/smem.cuh computes it, by kNT = 1, 2, 4, 8
// (static_asserts there keep the two equal): the timing model, which cannot see the kernel's
// structs, walks the kernel's geometry from here.
inline constexpr GemmLayout kMegakernelLayouts[4] = {{79104, 4}, {70656, 4}, {65536, 2}, {65536, 1}};
constexpr GemmLayout megakernel_layout(int32_t kNT) {
  return kMegakernelLayouts[kNT <= 1 ? 0 : kNT <= 2 ? 1 : kNT <= 4 ? 2 : 3];
}

// Every GEMM kind's geometry in a step of shape `s` on layout `l`: pages of at most page_rb_max
// row blocks, activation windows of the batch's rows in the activation area; the expert-down jobs
// hold their activation rows over the whole moe_intermediate (one window). The dense FFN: its up
// as the expert up's (K = hidden, the batch's rows), its down as O-proj's with K = dense_inter
// (without dense layers that kind is never walked: it then copies O-proj's). Computed once per step
// on the host (MkParams::geo); the timing model counts its pages and window fills.
inline void gemm_geometry(const PlanShape& s, const GemmLayout& l, GemmGeo (&geo)[kNumGemmKinds]) {
  const int32_t h_kb = s.hidden / 16;
  geo[kGemmQkv] = gemm_geo(h_kb, l.page_rb_max, s.batch, l.act_bytes);
  geo[kGemmOProj] = gemm_geo(s.n_heads * s.head_dim / 16, l.page_rb_max, s.batch, l.act_bytes);
  geo[kGemmRouter] = geo[kGemmQkv];
  geo[kGemmLmHead] = geo[kGemmQkv];
  geo[kGemmUp] = geo[kGemmQkv];
  geo[kGemmDown] = gemm_geo(s.moe_inter / 16, l.page_rb_max, 1, int64_t{1} << 40);
  geo[kGemmDenseUp] = geo[kGemmQkv];
  geo[kGemmDenseDown] =
      s.dense_inter > 0 ? gemm_geo(s.dense_inter / 16, l.page_rb_max, s.batch, l.act_bytes) : geo[kGemmOProj];
  for (GemmGeo& g : geo) {
    const int64_t rows = l.act_bytes / (static_cast<int64_t>(g.pitch) * 2);
    g.rows_cap = static_cast<int32_t>(rows < (int64_t{1} << 30) ? rows : (int64_t{1} << 30));
  }
}

// The expert-down jobs of a share of row blocks [rb_begin, rb_end): for each row block, each
// active expert in order, its slots (tokens) in chunks of at most rows_cap, so that a job's
// activation rows always fit the area at the whole K (an expert may take every token of the batch:
// 64 rows, where the area holds 42 at 64 tokens). The loader and the consumers walk it alike
// (cuda/megakernel/ops.cuh JobWalk); so does the timing model. `count(ei)` gives the tokens of
// active expert ei (at least 1).
struct DownJob {
  int32_t rb, ei;       // the row block and the active expert index
  int32_t tok0, n_tok;  // the expert's slots [tok0, tok0 + n_tok)
};
// One step of the walk from position (rb, ei, tok), which it advances; false past rb_end. The
// caller starts at (rb_begin, 0, 0); after a row block's last job, rb has moved past out.rb.
// Stateless beyond those three, so the kernel keeps no more.
template <class Count>
MD_HOST_DEVICE inline bool down_walk_next(int32_t& rb, int32_t& ei, int32_t& tok, int32_t rb_end, int32_t n_active,
                                          int32_t rows_cap, Count&& count, DownJob& out) {
  if (rb >= rb_end || n_active <= 0) return false;
  const int32_t n = count(ei), cap = rows_cap > 0 ? rows_cap : 1;
  out.rb = rb;
  out.ei = ei;
  out.tok0 = tok;
  out.n_tok = n - tok < cap ? n - tok : cap;
  tok += cap;
  if (tok >= n) {
    tok = 0;
    if (++ei == n_active) {
      ei = 0;
      ++rb;
    }
  }
  return true;
}

// The activation group a down job starts when the area does not hold its slots [j0, j1) (slot
// numbers of the layer, expert-major): its own slots and every following active expert's whole
// slot range (from active index next_ei on) while the group stays within rows_cap rows. Returns the
// group's end slot; the group is [j0, end). expert_end(i) is one past active expert i's last slot.
template <class Slots>
MD_HOST_DEVICE inline int32_t down_group_end(Slots&& expert_end, int32_t n_active, int32_t next_ei, int32_t j0, int32_t j1,
                                             int32_t rows_cap) {
  if (rows_cap < 1) rows_cap = 1;  // as down_walk_next
  int32_t end = j1;
  for (int32_t i = next_ei; i < n_active; ++i) {
    const int32_t e_end = expert_end(i);
    if (e_end - j0 > rows_cap) break;
    end = e_end;
  }
  return end;
}

// The pages of a job of n_rb row blocks, in order: f(rb0, nrb, kb0) for page "row blocks
// [rb0, rb0 + nrb), k blocks [kb0, kb0 + page_kb)"; false as soon as f returns false. The loader
// walks it; the consumers' loop (gemm.cuh consume_job) has the same two loops.
template <class F>
MD_HOST_DEVICE inline bool walk_pages(const GemmGeo& g, int32_t n_rb, F&& f) {
  for (int32_t rb0 = 0; rb0 < n_rb; rb0 += g.page_rb) {
    const int32_t nrb = n_rb - rb0 < g.page_rb ? n_rb - rb0 : g.page_rb;
    for (int32_t kb0 = 0; kb0 < g.n_kb; kb0 += g.page_kb)
      if (!f(rb0, nrb, kb0)) return false;
  }
  return true;
}

// Element offset of tile (rb, kb) in a packed matrix of n_kb k blocks per row block.
MD_HOST_DEVICE inline int64_t tile_offset(int32_t rb, int32_t n_kb, int32_t kb) {
  return (static_cast<int64_t>(rb) * n_kb + kb) * kTileElems;
}

}  // namespace megadecode
