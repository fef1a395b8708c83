// The many-row GEMM engine (src/cuda/gemm/gemm.h) against fp64 host dot products of the same bf16
// values, at every tile configuration (1..257 tokens: token groups 1, 2, 4, 8, 16), with X at a row
// offset, residual and SwiGLU epilogues, partial row / token / k tiles, K split 1..5 ways, and grouped
// per-expert tile lists of every tile size with a hot expert spanning several tiles. Then the
// engine's invariance: a token's outputs are bitwise the same whatever the other tokens, their
// number and the tile size (dense at a fixed split; grouped at any tile size). Outputs are
// NaN-poisoned first; columns past the output must stay poisoned.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "cuda/common/kernels.h"
#include "cuda/common/weight_pack.cuh"
#include "cuda/gemm/gemm.h"
#include "../gemm_test_util.h"
#include "../gpu_test_util.h"

namespace megadecode::cuda::gemm {
namespace {

using test::DeviceBuffer;
using test::packed_weights;
using test::silu_ref;
using test::worst_ratio;

// A split dense GEMM's workspace and semaphores (zeroed once, as the engine requires).
struct SplitScratch {
  DeviceBuffer<float> ws;
  DeviceBuffer<int32_t> sem;
  SplitScratch(int n_tokens, int n_rows, int splits)
      : ws(workspace_floats(n_tokens, n_rows, dense_tile_groups(n_rows, n_tokens, splits, sm_count()), splits)),
        sem(semaphore_count(n_tokens, n_rows, dense_tile_groups(n_rows, n_tokens, splits, sm_count()))) {
    ws.poison();
    sem.fill_bytes(0);
  }
  void attach(GemmArgs& a, int splits) {
    a.k_splits = splits;
    a.workspace = splits > 1 ? ws.get() : nullptr;
    a.semaphores = splits > 1 ? sem.get() : nullptr;
  }
};

TEST(Gemm, DenseEpiloguesMatchHost) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Gemm dense"));
  struct Case {
    int rows, k, tokens, splits;
  };
  const std::vector<Case> cases = {{1, 16, 1, 1},      {37, 48, 9, 1},     {200, 208, 17, 1}, {144, 256, 40, 2},
                                   {300, 640, 64, 5},  {128, 384, 100, 3}, {96, 80, 130, 1},  {260, 1024, 257, 4},
                                   {16, 2048, 3, 8},
                                   // Two bands of columns each (dense_band: 256 KB and 512 KB columns
                                   // of 8 and 16 tokens, 88 and 34 columns), the last one narrower.
                                   {48, 16384, 700, 1}, {40, 16384, 530, 3}};
  for (const Case cs : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << cs.rows << " k " << cs.k << " tokens " << cs.tokens << " splits "
                                      << cs.splits);
    const int xs = cs.k + 8, ys = cs.rows + 3, n_x = cs.tokens + 5;
    DeviceBuffer<uint16_t> w(packed_elements(cs.rows, cs.k));
    const test::Bf16Data wh = packed_weights(w.get(), cs.rows, cs.k, rng, 1.0f);
    const test::Bf16Data xh = test::random_bf16(static_cast<size_t>(n_x) * xs, rng, 1.0f);
    const test::Bf16Data res = test::random_bf16(static_cast<size_t>(cs.tokens) * ys, rng, 4.0f);
    DeviceBuffer<uint16_t> x(xh.bits);
    DeviceBuffer<float> y(static_cast<size_t>(cs.tokens) * ys), r(res.values);
    SplitScratch scratch(cs.tokens, cs.rows, cs.splits);
    for (Epilogue epi : {Epilogue::kStore, Epilogue::kResidual, Epilogue::kSwiGlu}) {
      if (epi == Epilogue::kSwiGlu && (cs.rows % 16 != 0 || cs.splits > 1)) continue;
      const int x_row0 = epi == Epilogue::kResidual ? 0 : 5;  // X's rows start inside the buffer
      const int out_cols = epi == Epilogue::kSwiGlu ? cs.rows / 2 : cs.rows;
      DeviceBuffer<uint16_t> yb(static_cast<size_t>(cs.tokens) * ys);
      y.poison();
      yb.poison();
      GemmArgs a;
      a.w = w.get();
      a.n_rows = cs.rows;
      a.k = cs.k;
      a.x = x.get() + static_cast<size_t>(x_row0) * xs;
      a.x_stride = xs;
      a.n_tokens = cs.tokens;
      a.y = epi == Epilogue::kSwiGlu ? static_cast<void*>(yb.get()) : static_cast<void*>(y.get());
      a.y_stride = ys;
      a.residual = r.get();
      a.residual_stride = ys;
      scratch.attach(a, cs.splits);
      gemm(a, epi, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      auto dot = [&](int row, int t) {
        const int xr = x_row0 + t;
        double s = 0;
        for (int kk = 0; kk < cs.k; ++kk)
          s += double(wh.values[static_cast<size_t>(row) * cs.k + kk]) * xh.values[static_cast<size_t>(xr) * xs + kk];
        return s;
      };
      std::vector<float> got;
      std::vector<double> want;
      int64_t stray = 0;
      if (epi == Epilogue::kSwiGlu) {
        const std::vector<uint16_t> out = yb.download();
        for (int t = 0; t < cs.tokens; ++t)
          for (int col = 0; col < ys; ++col) {
            const uint16_t v = out[static_cast<size_t>(t) * ys + col];
            if (col >= out_cols) {
              stray += v != 0xffff;
              continue;
            }
            const int gate = (col / 8) * 16 + col % 8;  // DeviceWeights' interleave (swiglu_col)
            got.push_back(bf16_bits_to_float(v));
            want.push_back(silu_ref(dot(gate, t)) * dot(gate + 8, t));
          }
      } else {
        const std::vector<float> out = y.download();
        for (int t = 0; t < cs.tokens; ++t)
          for (int col = 0; col < ys; ++col) {
            const float v = out[static_cast<size_t>(t) * ys + col];
            if (col >= out_cols) {
              stray += !std::isnan(v);
              continue;
            }
            got.push_back(v);
            want.push_back(dot(col, t) +
                           (epi == Epilogue::kResidual ? res.values[static_cast<size_t>(t) * ys + col] : 0.0));
          }
      }
      // fp32 accumulation of <= 16384 products of values in [-1, 1]: far inside the bound.
      EXPECT_LE(worst_ratio(got, want, 1e-4), 1.0) << "epilogue " << static_cast<int>(epi);
      EXPECT_EQ(stray, 0) << "epilogue " << static_cast<int>(epi) << " wrote past its columns";
    }
    // The semaphores are left zero for the next call (one zeroing at allocation serves all calls).
    for (int32_t v : scratch.sem.download()) ASSERT_EQ(v, 0);
  }
}

// A token's outputs do not depend on the other tokens: the first rows of a 256-token product equal,
// bit for bit, the product of those rows alone at every token count (every tile size), for a fixed
// split count, and across calls.
TEST(Gemm, DenseRowsAreBitwiseBatchInvariant) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Gemm invariance"));
  const int rows = 272, k = 1024, big = 256;
  for (int splits : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "splits " << splits);
    DeviceBuffer<uint16_t> w(packed_elements(rows, k));
    (void)packed_weights(w.get(), rows, k, rng, 1.0f);
    const test::Bf16Data xh = test::random_bf16(static_cast<size_t>(big) * k, rng, 1.0f);
    DeviceBuffer<uint16_t> x(xh.bits);
    auto run = [&](int n) {
      DeviceBuffer<float> y(static_cast<size_t>(n) * rows);
      y.poison();
      SplitScratch scratch(n, rows, splits);
      GemmArgs a;
      a.w = w.get();
      a.n_rows = rows;
      a.k = k;
      a.x = x.get();
      a.x_stride = k;
      a.n_tokens = n;
      a.y = y.get();
      a.y_stride = rows;
      scratch.attach(a, splits);
      gemm(a, Epilogue::kStore, nullptr);
      return y.download();
    };
    const std::vector<float> all = run(big);
    for (float v : all) ASSERT_TRUE(std::isfinite(v));
    // 65 ... 256 tokens: 128-token tiles whose last one holds 1 to 8 groups of 16 tokens.
    for (int n : {1, 5, 8, 9, 16, 31, 64, 65, 90, 100, 113, 128, 145, 180, 200, 230, 256}) {
      const std::vector<float> part = run(n);
      EXPECT_TRUE(test::bitwise_equal(part.data(), all.data(), part.size() * sizeof(float))) << n << " tokens";
    }
  }
}

// Grouped GEMMs over host-built tile lists of every tile size: each slot's gate/up (SwiGLU) and down
// rows match the host, and are bitwise the same at every tile size.
TEST(Gemm, GroupedTilesOfEverySizeMatchHostAndEachOther) {
  MD_REQUIRE_GPU();
  SplitMix64 rng(test::seed_for("Gemm grouped"));
  const int E = 12, H = 160, I = 80;
  // Expert 2 hot, 9..11 empty; the 128-token tiles hold every count of 16-token groups, 1 to 8
  // (5, 20, 40, 61, 75, 93, 110 rows; 139 and 440 end in 11 and 56; full tiles).
  std::vector<int32_t> counts = {5, 20, 440, 40, 61, 75, 93, 110, 139, 0, 0, 0};
  const int n_slots = std::accumulate(counts.begin(), counts.end(), 0);
  std::vector<int32_t> slot_token(n_slots), slot_expert(n_slots);
  for (int e = 0, s = 0; e < E; ++e)
    for (int i = 0; i < counts[e]; ++i) slot_expert[s++] = e;
  const int n_x = 257;
  for (int s = 0; s < n_slots; ++s) slot_token[s] = static_cast<int32_t>(rng.below(n_x));
  const int64_t up_stride = packed_elements(2 * I, H), down_stride = packed_elements(H, I);
  DeviceBuffer<uint16_t> w_up(up_stride * E), w_down(down_stride * E);
  std::vector<test::Bf16Data> up_h, down_h;
  for (int e = 0; e < E; ++e) {
    up_h.push_back(packed_weights(w_up.get() + e * up_stride, 2 * I, H, rng, 0.3f));
    down_h.push_back(packed_weights(w_down.get() + e * down_stride, H, I, rng, 0.3f));
  }
  const test::Bf16Data xh = test::random_bf16(static_cast<size_t>(n_x) * H, rng, 1.0f);
  std::vector<uint16_t> slot_rows(static_cast<size_t>(n_slots) * H);  // X in slot order, as moe_lists writes it
  for (int s = 0; s < n_slots; ++s)
    std::copy_n(xh.bits.begin() + int64_t{slot_token[s]} * H, H, slot_rows.begin() + int64_t{s} * H);
  DeviceBuffer<uint16_t> x(slot_rows);
  std::vector<uint16_t> first_hidden;
  std::vector<float> first_down;
  for (int nt : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE(::testing::Message() << "token groups " << nt);
    const int cap = moe_tile_capacity(n_slots, E, 8 * nt);
    std::vector<MoeTile> tiles(cap);
    std::vector<int32_t> offsets(E + 1);
    const int n_tiles = build_moe_tiles(counts.data(), E, 8 * nt, offsets.data(), tiles.data(), cap);
    ASSERT_GT(n_tiles, 0);
    std::set<int> groups16;  // the 16-token groups each tile holds
    for (int i = 0; i < n_tiles; ++i) groups16.insert((tiles[i].n + 15) / 16);
    if (nt == 16) ASSERT_EQ(groups16.size(), 8u) << "the tiles miss a 16-token group count";
    DeviceBuffer<MoeTile> d_tiles(tiles);
    DeviceBuffer<int32_t> d_n(std::vector<int32_t>{n_tiles});
    DeviceBuffer<uint16_t> hidden(static_cast<size_t>(n_slots) * I);
    DeviceBuffer<float> down(static_cast<size_t>(n_slots) * H);
    hidden.poison();
    down.poison();
    GemmArgs up;
    up.w = w_up.get();
    up.w_expert_stride = up_stride;
    up.n_experts = E;
    up.n_rows = 2 * I;
    up.k = H;
    up.x = x.get();
    up.x_stride = H;
    up.x_rows = n_slots;
    up.tiles = d_tiles.get();
    up.n_tiles = d_n.get();
    up.tile_capacity = cap;
    up.token_groups = nt;
    up.y = hidden.get();
    up.y_stride = I;
    gemm(up, Epilogue::kSwiGlu, nullptr);
    GemmArgs dn = up;
    dn.w = w_down.get();
    dn.w_expert_stride = down_stride;
    dn.n_rows = H;
    dn.k = I;
    dn.x = hidden.get();
    dn.x_stride = I;
    dn.y = down.get();
    dn.y_stride = H;
    gemm(dn, Epilogue::kStore, nullptr);
    const std::vector<uint16_t> hid_bits = hidden.download();
    const std::vector<float> hid = test::bf16_to_float(hid_bits);
    const std::vector<float> dout = down.download();
    std::vector<double> want_h, want_d;
    for (int s = 0; s < n_slots; ++s) {
      const int e = slot_expert[s], tok = slot_token[s];
      auto up_dot = [&](int row) {
        double acc = 0;
        for (int kk = 0; kk < H; ++kk)
          acc += double(up_h[e].values[static_cast<size_t>(row) * H + kk]) * xh.values[static_cast<size_t>(tok) * H + kk];
        return acc;
      };
      for (int c = 0; c < I; ++c) want_h.push_back(silu_ref(up_dot((c / 8) * 16 + c % 8)) * up_dot((c / 8) * 16 + c % 8 + 8));
      for (int r = 0; r < H; ++r) {  // from the device's own hidden row: the down GEMM alone
        double acc = 0;
        for (int kk = 0; kk < I; ++kk)
          acc += double(down_h[e].values[static_cast<size_t>(r) * I + kk]) * hid[static_cast<size_t>(s) * I + kk];
        want_d.push_back(acc);
      }
    }
    EXPECT_LE(worst_ratio(hid, want_h, 1e-4), 1.0) << "grouped gate/up (SwiGLU)";
    EXPECT_LE(worst_ratio(dout, want_d, 1e-4), 1.0) << "grouped down";
    if (first_hidden.empty()) {
      first_hidden = hid_bits;
      first_down = dout;
    } else {
      EXPECT_EQ(hid_bits, first_hidden) << "gate/up differs from the 8-token tiles' bits";
      EXPECT_TRUE(test::bitwise_equal(dout.data(), first_down.data(), dout.size() * sizeof(float)))
          << "down differs from the 8-token tiles' bits";
    }
  }
}

TEST(Gemm, BadArgumentsAreErrors) {
  MD_REQUIRE_GPU();
  DeviceBuffer<uint16_t> w(packed_elements(32, 256)), x(8 * 256);
  DeviceBuffer<float> y(8 * 32);
  GemmArgs a;
  a.w = w.get();
  a.n_rows = 32;
  a.k = 256;
  a.x = x.get();
  a.x_stride = 256;
  a.n_tokens = 8;
  a.y = y.get();
  a.y_stride = 32;
  GemmArgs bad = a;
  bad.k = 24;  // not a multiple of 16
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  bad = a;
  bad.k_splits = 2;  // no workspace
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  bad = a;
  bad.k_splits = 3;  // more splits than 128-k units
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  bad = a;
  bad.token_groups = 3;
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  bad = a;
  bad.x_stride = 250;
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  // A grouped GEMM over contiguous rows must say how many rows its tiles may read.
  DeviceBuffer<MoeTile> tiles(std::vector<MoeTile>{MoeTile{0, 0, 8, 0}});
  DeviceBuffer<int32_t> n_tiles(std::vector<int32_t>{1});
  bad = a;
  bad.tiles = tiles.get();
  bad.n_tiles = n_tiles.get();
  bad.tile_capacity = 1;
  bad.token_groups = 1;
  bad.n_experts = 1;
  bad.w_expert_stride = packed_elements(a.n_rows, a.k);
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  bad.x_rows = 8;
  EXPECT_NO_THROW(gemm(bad, Epilogue::kStore, nullptr));
  // ... and how many experts' matrices its weights hold.
  bad.n_experts = 0;
  EXPECT_THROW(gemm(bad, Epilogue::kStore, nullptr), Error);
  bad.n_experts = 1;
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace megadecode::cuda::gemm
