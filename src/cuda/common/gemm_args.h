// Arguments of the skinny GEMM, shared by host launchers and device tiles.
#pragma once

#include <cstdint>

namespace megadecode::cuda {

struct SkinnyGemmArgs {
  const uint16_t* w_packed;  // packed [ceil(N/16)][ceil(K/16)][16x16] bf16 (weight_pack.cuh)
  const uint16_t* x;         // [n_tokens][x_stride] bf16, 16-byte aligned rows
  float* y;                  // [n_tokens][y_stride] fp32
  int n_rows;                // N
  int k;                     // K, a multiple of 16
  int n_tokens;              // B, 1..64
  int x_stride;              // elements, a multiple of 8
  int y_stride;              // elements
};

}  // namespace megadecode::cuda
