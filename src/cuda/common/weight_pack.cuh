// Packed weight layout for the skinny GEMM (weights are the mma.sync m16n8k16 A operand).
// A HF Linear weight W[N, K] (row-major bf16, [out, in]) is stored as 16x16 "fragment tiles" of
// 512 bytes, each already in the order the 32 lanes of a warp hold the A fragment, so one
// contiguous 1-D bulk copy brings a run of tiles into shared memory and each lane then reads its
// whole fragment with ONE conflict-free 16-byte shared load (no ldmatrix, no tensor map, no swizzle).
//
//   packed = [n_row_blocks = ceil(N/16)] [n_k_blocks = ceil(K/16)] [32 lanes] [8 bf16]
//   (rows >= N and k >= K are zero padding)
//
// One tile (rows r0..r0+15, k k0..k0+15); lane l = 4g + t holds 8 bf16 = a0 a1 a2 a3:
//
//              k0+2t, k0+2t+1            k0+2t+8, k0+2t+9
//            +----------------------+----------------------+
//   r0 + g   | a0  (elements 0, 1)  | a2  (elements 4, 5)  |     g = 0..7 (lane / 4)
//            +----------------------+----------------------+     t = 0..3 (lane % 4)
//   r0+8+g   | a1  (elements 2, 3)  | a3  (elements 6, 7)  |
//            +----------------------+----------------------+
//
//   byte offset of a tile = (rb * n_k_blocks + kb) * 512; lane l's fragment at + 16 * l.
// A row block (16 rows x all K) is contiguous (n_k_blocks * 512 bytes), so a stage of
// "row block rb, k blocks [kb, kb + n)" is one bulk copy of n * 512 bytes.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace megadecode::cuda {

constexpr int kPackRows = 16;       // rows per fragment tile (MMA M)
constexpr int kPackK = 16;          // k per fragment tile (MMA K)
constexpr int kPackTileBytes = 512; // 16 x 16 bf16

MD_HOST_DEVICE constexpr int64_t pack_row_blocks(int64_t n_rows) { return (n_rows + kPackRows - 1) / kPackRows; }
MD_HOST_DEVICE constexpr int64_t pack_k_blocks(int64_t k) { return (k + kPackK - 1) / kPackK; }
// Elements (bf16) of the packed buffer, padding included.
MD_HOST_DEVICE constexpr int64_t packed_elements(int64_t n_rows, int64_t k) {
  return pack_row_blocks(n_rows) * pack_k_blocks(k) * (kPackRows * kPackK);
}

// Element offset in the packed buffer of W[row][k].
MD_HOST_DEVICE constexpr int64_t packed_offset(int64_t row, int64_t k, int64_t n_k_blocks) {
  const int64_t tile = (row / kPackRows) * n_k_blocks + k / kPackK;
  const int r = static_cast<int>(row % kPackRows), c = static_cast<int>(k % kPackK);
  const int lane = (r % 8) * 4 + (c % 8) / 2;
  const int reg = r / 8 + 2 * (c / 8);
  return tile * (kPackRows * kPackK) + lane * 8 + reg * 2 + (c & 1);
}

struct PackedCoord {
  int64_t row;
  int64_t k;
};

// Inverse of packed_offset: which W[row][k] lives at packed element `offset`.
MD_HOST_DEVICE constexpr PackedCoord packed_coord(int64_t offset, int64_t n_k_blocks) {
  const int64_t tile = offset / (kPackRows * kPackK);
  const int w = static_cast<int>(offset % (kPackRows * kPackK));
  const int lane = w / 8, reg = (w % 8) / 2, elem = w % 2;
  const int g = lane / 4, t = lane % 4;
  return PackedCoord{(tile / n_k_blocks) * kPackRows + g + 8 * (reg & 1),
                     (tile % n_k_blocks) * kPackK + 2 * t + 8 * (reg >> 1) + elem};
}

}  // namespace megadecode::cuda
