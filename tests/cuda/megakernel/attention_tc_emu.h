// A lane-level CPU emulation of the megakernel's tensor-core attention item (attention_item.cuh),
// step for step: per-warp cp.async groups (bytes in flight are poisoned with NaN until the
// wait_group that lands them, so an early read shows), the K/V patch of the new token,
// ldmatrix(.trans) and mma.m16n8k16 on the PTX fragment layouts, quad shuffles, the online
// softmax, the warp merge and the split merge. It uses the same helpers (attention_geo.h) as the
// device code; the instruction semantics are written here from the PTX ISA. The reference is the
// tests' one attention oracle (tests/ref/naive_attention.h) over the case's keys: in double, and in
// plain fp32 (the rounding a scalar kernel has).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../ref/naive_attention.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "cuda/megakernel/attention_geo.h"

namespace megadecode::cuda::mk {

struct EmuCase {
  int G, group, bs, D, gs, n;
  std::vector<int32_t> bt;
  std::vector<uint16_t> kc, vc;      // one layer's K and V cache [n_blocks][G][bs][D] bf16
  std::vector<float> q;              // [gs][D] rotated q (fp32)
  std::vector<uint16_t> knew, vnew;  // [D] the appended row (its cache slot still holds noise)
  float scale;
};

// History U(-1.7, 1.7) at positions < n-1, large noise everywhere else (the GPU test's layout).
inline EmuCase make_emu_case(SplitMix64& rng, int G, int group, int bs, int D, int gs, int n,
                             const std::vector<int32_t>& bt) {
  EmuCase k{G, group, bs, D, gs, n, bt, {}, {}, {}, {}, {}, 1.0f / std::sqrt(static_cast<float>(D))};
  const int32_t n_blocks = *std::max_element(bt.begin(), bt.end()) + 1;
  const size_t elems = static_cast<size_t>(n_blocks) * G * bs * D;
  auto noise = [&] { return float_to_bf16_bits((rng.unit() < 0.5f ? -1.0f : 1.0f) * (1000.0f + 30000.0f * rng.unit())); };
  auto hist = [&] { return float_to_bf16_bits(1.7f * (2.0f * rng.unit() - 1.0f)); };
  k.kc.resize(elems);
  k.vc.resize(elems);
  for (size_t i = 0; i < elems; ++i) {
    k.kc[i] = noise();
    k.vc[i] = noise();
  }
  for (int j = 0; j + 1 < n; ++j)
    for (int d = 0; d < D; ++d) {
      const int64_t at = ((static_cast<int64_t>(bt[j / bs]) * G + group) * bs + j % bs) * D + d;
      k.kc[at] = hist();
      k.vc[at] = hist();
    }
  k.q.resize(static_cast<size_t>(gs) * D);
  for (float& x : k.q) x = 1.7320508f * (2.0f * rng.unit() - 1.0f);
  k.knew.resize(D);
  k.vnew.resize(D);
  for (int d = 0; d < D; ++d) {
    k.knew[d] = hist();
    k.vnew[d] = hist();
  }
  return k;
}

inline float emu_key(const EmuCase& k, const std::vector<uint16_t>& cache, const std::vector<uint16_t>& row, int j,
                     int d) {
  if (j == k.n - 1) return bf16_bits_to_float(row[d]);
  return bf16_bits_to_float(cache[((static_cast<int64_t>(k.bt[j / k.bs]) * k.G + k.group) * k.bs + j % k.bs) * k.D + d]);
}

// [gs][D] attention over the case's keys (the appended row included) in T arithmetic.
template <class T>
std::vector<T> emu_reference(const EmuCase& k) {
  std::vector<T> out;
  for (int h = 0; h < k.gs; ++h) {
    const std::vector<T> head = test::naive::attention<T>(
        k.n, k.D, k.scale, [&](int d) { return k.q[h * k.D + d]; },
        [&](int j, int d) { return emu_key(k, k.kc, k.knew, j, d); },
        [&](int j, int d) { return emu_key(k, k.vc, k.vnew, j, d); });
    out.insert(out.end(), head.begin(), head.end());
  }
  return out;
}

// ---- one warp's hardware: stage bytes, per-lane cp.async groups, ldmatrix, mma ----
struct EmuCopy {
  size_t dst;
  const uint16_t* src;  // nullptr: zero-fill
};

struct EmuWarp {
  std::vector<uint8_t> stage = std::vector<uint8_t>(2 * kAttnStageBytes, 0xff);  // K | V, NaN garbage
  std::array<std::vector<std::vector<EmuCopy>>, 32> groups;  // per lane: committed groups, oldest first
  std::array<std::vector<EmuCopy>, 32> open;                 // per lane: issued, not committed

  void cp_async(int lane, size_t dst, const uint16_t* src) {
    std::memset(&stage[dst], 0xff, 16);  // in flight: unknown until it lands
    open[lane].push_back({dst, src});
  }
  void commit(int lane) {
    groups[lane].push_back(open[lane]);
    open[lane].clear();
  }
  void wait_group(int pending) {
    for (int lane = 0; lane < 32; ++lane)
      while (static_cast<int>(groups[lane].size()) > pending) {
        for (const EmuCopy& c : groups[lane].front()) {
          if (c.src) std::memcpy(&stage[c.dst], c.src, 16);
          else std::memset(&stage[c.dst], 0, 16);
        }
        groups[lane].erase(groups[lane].begin());
      }
  }
  uint16_t at(size_t byte) const {
    uint16_t v;
    std::memcpy(&v, &stage[byte], 2);
    return v;
  }
  // ldmatrix.x4 (.trans): lane 8i + j gives row j of matrix i; reg i of lane = elements
  // (row lane/4, cols 2(lane%4), +1) of matrix i, or with .trans (rows 2(lane%4), +1; col lane/4).
  void ldmatrix(const std::array<size_t, 32>& row_addr, bool trans, std::array<std::array<uint32_t, 4>, 32>& r) const {
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int g = lane / 4, t = lane % 4;
        uint16_t lo, hi;
        if (!trans) {
          lo = at(row_addr[8 * i + g] + 2 * (2 * t));
          hi = at(row_addr[8 * i + g] + 2 * (2 * t + 1));
        } else {
          lo = at(row_addr[8 * i + 2 * t] + 2 * g);
          hi = at(row_addr[8 * i + 2 * t + 1] + 2 * g);
        }
        r[lane][i] = lo | (static_cast<uint32_t>(hi) << 16);
      }
  }
};

inline float emu_lo(uint32_t w) { return bf16_bits_to_float(static_cast<uint16_t>(w & 0xffff)); }
inline float emu_hi(uint32_t w) { return bf16_bits_to_float(static_cast<uint16_t>(w >> 16)); }

// d += A B, m16n8k16 bf16 -> fp32: A fragment a[lane][4], B fragment (b0, b1)[lane], D d[lane][4].
inline void emu_mma(std::array<std::array<float, 4>, 32>& d, const std::array<std::array<uint32_t, 4>, 32>& a,
                    const std::array<std::array<uint32_t, 2>, 32>& b) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
      A[row][col] = emu_lo(a[lane][r]);
      A[row][col + 1] = emu_hi(a[lane][r]);
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * t + 8 * r][g] = emu_lo(b[lane][r]);
      B[2 * t + 8 * r + 1][g] = emu_hi(b[lane][r]);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
      float acc = d[lane][e];
      for (int kk = 0; kk < 16; ++kk) acc += A[row][kk] * B[kk][col];  // bf16 x bf16 is exact in fp32
      d[lane][e] = acc;
    }
  }
}

// The item's partial (o [gs][D], m/l [gs]) of one split, as op_attn (attention_item.cuh) computes it.
struct EmuPartial {
  std::vector<float> o, m, l;
};

inline EmuPartial emu_tc_item(const EmuCase& k, const AttnGeo& g, int terms) {
  using Acc = std::array<std::array<float, 4>, 32>;
  using Frag = std::array<std::array<uint32_t, 4>, 32>;
  using BFrag = std::array<std::array<uint32_t, 2>, 32>;
  const int D = k.D, gs = k.gs;
  const bool appends = g.pos_end == k.n;
  const int n_chunks = attn_n_chunks(g.pos_begin, g.pos_end);
  static uint32_t qfrag[kAttnMaxTerms][kAttnMaxDim / 16][4][32];
  for (int kk = 0; kk < D / 16; ++kk)
    for (int r = 0; r < 4; ++r)
      for (int ln = 0; ln < 32; ++ln) {
        const AttnRC rc = attn_qfrag_coord(ln, r, kk);
        const bool use = rc.row < gs;
        uint16_t a[kAttnMaxTerms], b[kAttnMaxTerms];
        attn_split_terms(use ? k.q[rc.row * D + rc.col] : 0.0f, terms, a);
        attn_split_terms(use ? k.q[rc.row * D + rc.col + 1] : 0.0f, terms, b);
        for (int i = 0; i < kAttnMaxTerms; ++i) qfrag[i][kk][r][ln] = a[i] | (static_cast<uint32_t>(b[i]) << 16);
      }
  const float scale_log2 = attn_scale_log2(k.scale);
  std::vector<float> red_o(static_cast<size_t>(kAttnWarps) * gs * D), red_ml(static_cast<size_t>(kAttnWarps) * gs * 2);
  for (int warp = 0; warp < kAttnWarps; ++warp) {
    EmuWarp w;
    auto load = [&](const std::vector<uint16_t>& cache, int c, size_t base) {
      for (int lane = 0; lane < 32; ++lane) {
        const AttnLanePieces lp = attn_lane_pieces(lane, D);  // the device's walk (attention.cuh attn_load)
        for (int row = lp.row0; row < kAttnRows; row += lp.step) {
          const int tok = g.token(c, row);
          w.cp_async(lane, base + row * kAttnPitch + lp.ch * 16, g.copied(tok) ? cache.data() + g.at(tok) + lp.ch * 8 : nullptr);
        }
        w.commit(lane);
      }
    };
    auto commit_empty = [&] {
      for (int lane = 0; lane < 32; ++lane) w.commit(lane);
    };
    auto patch = [&](int c, const std::vector<uint16_t>& row, size_t base) {
      const int r = g.patch_row(c);
      if (r >= 0)
        for (int lane = 0; lane < D / 8; ++lane) std::memcpy(&w.stage[base + r * kAttnPitch + lane * 16], row.data() + lane * 8, 16);
    };
    std::vector<Acc> o(kAttnMaxDim / 8);
    for (Acc& a : o)
      for (auto& x : a) x = {0, 0, 0, 0};
    float m[32][2], l[32][2];
    for (int lane = 0; lane < 32; ++lane) m[lane][0] = m[lane][1] = -INFINITY, l[lane][0] = l[lane][1] = 0.0f;
    if (warp < n_chunks) {
      load(k.kc, warp, 0);
      load(k.vc, warp, kAttnStageBytes);
    }
    for (int c = warp; c < n_chunks; c += kAttnWarps) {
      w.wait_group(1);
      if (appends) patch(c, k.knew, 0);
      Acc sv[2] = {};
      for (int kk = 0; kk < D / 16; ++kk) {
        std::array<size_t, 32> addr;
        for (int lane = 0; lane < 32; ++lane) {
          const AttnRC a = attn_k_ldm(lane, kk);
          addr[lane] = a.row * kAttnPitch + a.col * 2;
        }
        Frag bk;
        w.ldmatrix(addr, false, bk);
        BFrag b0, b1;
        for (int lane = 0; lane < 32; ++lane) b0[lane] = {bk[lane][0], bk[lane][1]}, b1[lane] = {bk[lane][2], bk[lane][3]};
        for (int term = 0; term < terms; ++term) {
          Frag qa;
          for (int lane = 0; lane < 32; ++lane)
            for (int r = 0; r < 4; ++r) qa[lane][r] = qfrag[term][kk][r][lane];
          emu_mma(sv[0], qa, b0);
          emu_mma(sv[1], qa, b1);
        }
      }
      const int next = c + kAttnWarps;
      if (next < n_chunks) load(k.kc, next, 0);
      else commit_empty();
      // Row h of a lane's scores (AttnFragRow's order: score i is tile i / 2, element 2h + i % 2).
      auto row = [&sv](int lane, int h) {
        return [&sv, lane, h](int i) -> float& { return sv[i >> 1][lane][2 * h + (i & 1)]; };
      };
      float tm[32][2], rsum[32][2], alpha[32][2];
      for (int lane = 0; lane < 32; ++lane)
        for (int h = 0; h < 2; ++h)
          tm[lane][h] = attn_scale_mask(4, row(lane, h), scale_log2, [&](int i) {
            return g.token(c, attn_score_coord(lane, i >> 1, 2 * h + (i & 1)).col) < g.pos_end;
          });
      for (int x : {1, 2}) {  // __shfl_xor_sync within the quad
        float cp[32][2];
        std::memcpy(cp, tm, sizeof(cp));
        for (int lane = 0; lane < 32; ++lane)
          for (int h = 0; h < 2; ++h) tm[lane][h] = std::max(cp[lane][h], cp[lane ^ x][h]);
      }
      for (int lane = 0; lane < 32; ++lane)
        for (int h = 0; h < 2; ++h) {
          const AttnTileExp t = attn_exp_tile(m[lane][h], tm[lane][h], 4, row(lane, h), AttnIdentity{});
          alpha[lane][h] = t.alpha;
          rsum[lane][h] = t.sum;
        }
      for (int x : {1, 2}) {
        float cp[32][2];
        std::memcpy(cp, rsum, sizeof(cp));
        for (int lane = 0; lane < 32; ++lane)
          for (int h = 0; h < 2; ++h) rsum[lane][h] = cp[lane][h] + cp[lane ^ x][h];
      }
      std::vector<Frag> pa(terms);
      for (int lane = 0; lane < 32; ++lane) {
        for (int h = 0; h < 2; ++h) l[lane][h] = l[lane][h] * alpha[lane][h] + rsum[lane][h];
        const float pairs[4][2] = {{sv[0][lane][0], sv[0][lane][1]}, {sv[0][lane][2], sv[0][lane][3]},
                                   {sv[1][lane][0], sv[1][lane][1]}, {sv[1][lane][2], sv[1][lane][3]}};
        for (int r = 0; r < 4; ++r) {
          uint16_t a[kAttnMaxTerms], b[kAttnMaxTerms];
          attn_split_terms(pairs[r][0], terms, a);
          attn_split_terms(pairs[r][1], terms, b);
          for (int term = 0; term < terms; ++term) pa[term][lane][r] = a[term] | (static_cast<uint32_t>(b[term]) << 16);
        }
      }
      w.wait_group(1);
      if (appends) patch(c, k.vnew, kAttnStageBytes);
      for (int dn = 0; dn < D / 8; dn += 2) {
        std::array<size_t, 32> addr;
        for (int lane = 0; lane < 32; ++lane) {
          const AttnRC a = attn_v_ldm(lane, dn);
          addr[lane] = kAttnStageBytes + a.row * kAttnPitch + a.col * 2;
        }
        Frag bv;
        w.ldmatrix(addr, true, bv);
        BFrag b0, b1;
        for (int lane = 0; lane < 32; ++lane) b0[lane] = {bv[lane][0], bv[lane][1]}, b1[lane] = {bv[lane][2], bv[lane][3]};
        Acc a0 = {}, a1 = {};
        for (int term = 0; term < terms; ++term) {
          emu_mma(a0, pa[term], b0);
          emu_mma(a1, pa[term], b1);
        }
        for (int lane = 0; lane < 32; ++lane)
          for (int e = 0; e < 4; ++e) {
            o[dn][lane][e] = std::fma(o[dn][lane][e], alpha[lane][e >> 1], a0[lane][e]);
            o[dn + 1][lane][e] = std::fma(o[dn + 1][lane][e], alpha[lane][e >> 1], a1[lane][e]);
          }
      }
      if (next < n_chunks) load(k.vc, next, kAttnStageBytes);
      else commit_empty();
    }
    w.wait_group(0);
    for (int lane = 0; lane < 32; ++lane) {
      for (int dn = 0; dn < D / 8; ++dn)
        for (int e = 0; e < 4; ++e) {
          const AttnRC rc = attn_out_coord(lane, dn, e);
          if (rc.row < gs) red_o[(warp * gs + rc.row) * D + rc.col] = o[dn][lane][e];
        }
      if (lane % 4 == 0)
        for (int h = 0; h < 2; ++h) {
          const int row = lane / 4 + 8 * h;
          if (row < gs) {
            red_ml[(warp * gs + row) * 2] = m[lane][h];
            red_ml[(warp * gs + row) * 2 + 1] = l[lane][h];
          }
        }
    }
  }
  EmuPartial out{std::vector<float>(static_cast<size_t>(gs) * D), std::vector<float>(gs), std::vector<float>(gs)};
  for (int idx = 0; idx < gs * D; ++idx) {
    const int row = idx / D, d = idx % D;
    float mx, sum;
    out.o[idx] = attn_merge(kAttnWarps, [&](int w) { return red_ml[(w * gs + row) * 2]; }, [&](int w) {
      return AttnPartial{red_ml[(w * gs + row) * 2], red_ml[(w * gs + row) * 2 + 1], red_o[(w * gs + row) * D + d]};
    }, mx, sum);
    if (d == 0) {
      out.m[row] = mx;
      out.l[row] = sum;
    }
  }
  return out;
}

// Every split of the sequence's (seq, group), merged in split order: [gs][D] (before the bf16 store).
inline std::vector<float> emu_tc_attention(const EmuCase& k, const std::vector<AttnGeo>& items, int terms) {
  std::vector<EmuPartial> parts;
  for (const AttnGeo& g : items) parts.push_back(emu_tc_item(k, g, terms));
  std::vector<float> out(static_cast<size_t>(k.gs) * k.D);
  for (int idx = 0; idx < k.gs * k.D; ++idx) {
    const int h = idx / k.D;
    float mx, den;
    const float num = attn_merge(static_cast<int>(parts.size()), [&](int sp) { return parts[sp].m[h]; },
                                 [&](int sp) { return AttnPartial{parts[sp].m[h], parts[sp].l[h], parts[sp].o[idx]}; },
                                 mx, den);
    out[idx] = attn_normalise(num, den);  // the device stores bf16 of this
  }
  return out;
}

struct EmuStats {
  double max_rel = 0;
  int64_t bf16_flips = 0, n = 0;
};

// max |out - ref| / max |ref| over the case; outputs whose bf16 (what the device stores) differs
// from bf16(ref).
inline void accumulate_stats(const std::vector<float>& out, const std::vector<double>& ref, EmuStats& st) {
  const size_t n = out.size();
  double mref = 0, merr = 0;
  for (size_t i = 0; i < n; ++i) {
    mref = std::max(mref, std::fabs(ref[i]));
    merr = std::max(merr, std::fabs(out[i] - ref[i]));
    st.bf16_flips += round_bf16(out[i]) != round_bf16(static_cast<float>(ref[i]));
  }
  st.n += static_cast<int64_t>(n);
  st.max_rel = std::max(st.max_rel, merr / std::max(mref, 1e-30));
}

}  // namespace megadecode::cuda::mk
