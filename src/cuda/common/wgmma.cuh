// wgmma (Hopper warpgroup MMA) wrappers for the GEMM engine and prefill attention: m64nNk16, bf16 x bf16 -> fp32, the A
// operand (64 weight rows) from registers, the B operand (N tokens x 16 k) from shared memory through
// a matrix descriptor (128-byte swizzle). A warpgroup is 4 consecutive warps; warp w of it supplies
// rows 16w..16w+15 of A in the mma.sync m16n8k16 A fragment layout (the packed weight layout,
// weight_pack.cuh), and holds
// rows 16w..16w+15 of D in the m16n8 C layout per 8 columns: d[j][e] is row g + 8 (e >> 1), column
// 8j + 2t + (e & 1) for lane (g, t). Every wrapper is one instruction (the MMA ones with their
// operands pinned); the ordering reasons live with the caller (gemm.cu).
#pragma once

#include <cstdint>


// The accumulator operands of an m64n64 (kG = 8) or m64n128 (kG = 16) wgmma, d[j][e] in order.
#define MD_WGMMA_ACC8(d)                                                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),       \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),   \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),   \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),   \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define MD_WGMMA_ACC16(d)                                                                                         \
  MD_WGMMA_ACC8(d), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]),    \
      "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),               \
      "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]),             \
      "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),             \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),             \
      "+f"(d[15][2]), "+f"(d[15][3])

// Their accumulator placeholders, %0 .. %(8 n - 1) for the first n k-groups of 8 tokens (n = 2, 4, ... 16).
#define MD_WGMMA_REGS8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define MD_WGMMA_REGS16 MD_WGMMA_REGS8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define MD_WGMMA_REGS24 MD_WGMMA_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define MD_WGMMA_REGS32 MD_WGMMA_REGS24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define MD_WGMMA_REGS40 MD_WGMMA_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define MD_WGMMA_REGS48 MD_WGMMA_REGS40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define MD_WGMMA_REGS56 MD_WGMMA_REGS48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define MD_WGMMA_REGS64 MD_WGMMA_REGS56 ", %56, %57, %58, %59, %60, %61, %62, %63"

namespace megadecode::cuda::ptx {

// B operand descriptor, K-major, 128-byte swizzle (as a TMA box of 64 bf16 k x N tokens with
// CU_TENSOR_MAP_SWIZZLE_128B writes it): token rows of 128 bytes, 8-row atoms of 1024 bytes (the
// SBO), 1024-byte aligned atoms. The k16 step j (0..3) of the atom starts 32 j bytes in: the
// hardware applies the swizzle to the address it forms, so the start moves by plain bytes. The LBO
// is unused by swizzled K-major layouts (encoded 1).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr) {
  return (static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4)) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
// Before a warpgroup's first wgmma that reads registers (accumulators, A) written by other
// instructions.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N of this warpgroup's committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Pins the accumulators at this point of the instruction stream: the compiler may not move their
// reads or writes across it (around wgmma_wait, whose asm names no registers).
template <int kG>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kG][4]) {
#pragma unroll
  for (int j = 0; j < kG; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// d = A * B + (scale_d ? d : 0) for one k16 step, N = 8 * kG tokens (kG = 1, 2, 4, 8; 16: wgmma_bf16_rs_first).
template <int kG>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[kG][4], const uint32_t (&a)[4], uint64_t b_desc, int scale_d);

template <>
__device__ __forceinline__ void wgmma_bf16_rs<1>(float (&d)[1][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs<2>(float (&d)[2][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs<4>(float (&d)[4][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs<8>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      MD_WGMMA_REGS32 "}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
      : MD_WGMMA_ACC8(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
}



// d[0 .. kN) = A * B + d[0 .. kN) for one k16 step over the first N = 8 kN tokens of an m64n128
// accumulator (kN = 2, 4, ... 16), the rest of d untouched: a GEMM tile holding fewer tokens than its
// size multiplies only the 16-token groups it holds. Each output's chain is the same instruction
// sequence whatever N, so the sums do not change with it.
template <int kN>
__device__ __forceinline__ void wgmma_bf16_rs_first(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b_desc);

#define MD_WGMMA_RS_FIRST(kN, N, REGS)                                                                       \
  template <>                                                                                               \
  __device__ __forceinline__ void wgmma_bf16_rs_first<kN>(float (&d)[16][4], const uint32_t (&a)[4],        \
                                                          uint64_t b_desc) {                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS                           \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"                                             \
                 : MD_WGMMA_ACC16(d)                                                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1)                          \
                 : "memory");                                                                               \
  }
MD_WGMMA_RS_FIRST(2, 16, MD_WGMMA_REGS8)
MD_WGMMA_RS_FIRST(4, 32, MD_WGMMA_REGS16)
MD_WGMMA_RS_FIRST(6, 48, MD_WGMMA_REGS24)
MD_WGMMA_RS_FIRST(8, 64, MD_WGMMA_REGS32)
MD_WGMMA_RS_FIRST(10, 80, MD_WGMMA_REGS40)
MD_WGMMA_RS_FIRST(12, 96, MD_WGMMA_REGS48)
MD_WGMMA_RS_FIRST(14, 112, MD_WGMMA_REGS56)
MD_WGMMA_RS_FIRST(16, 128, MD_WGMMA_REGS64)
#undef MD_WGMMA_RS_FIRST

// ---- the attention forms (prefill_attention.cu): both operands from shared memory, or B N-major ----
// A K-major A operand in shared memory (64 rows x 16 k) has the B operand's atoms: wgmma_desc_sw128.
// B operand descriptor, N-major (imm-trans-b 1), 128-byte swizzle: a [k][n] tile stored as rows of
// k, each row 64 n (128 bytes) per region; 8-row atoms of 1024 bytes step k (the SBO), regions of
// the next 64 n are lbo_bytes apart (the LBO). The k16 step j starts 2048 j bytes in.
__device__ __forceinline__ uint64_t wgmma_desc_b_mn_sw128(uint32_t smem_addr, uint32_t lbo_bytes) {
  return (static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4)) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// d = A * B + (scale_d ? d : 0), A (64 x 16) and B (16 x 8 kG, K-major) from shared memory.
template <int kG>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[kG][4], uint64_t a_desc, uint64_t b_desc, int scale_d);
// d = A * B + (scale_d ? d : 0), A from registers (the m16n8k16 fragments, as wgmma_bf16_rs), B N-major
// (16 k rows of 8 kG n: wgmma_desc_b_mn_sw128).
template <int kG>
__device__ __forceinline__ void wgmma_bf16_rs_tb(float (&d)[kG][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                 int scale_d);

template <>
__device__ __forceinline__ void wgmma_bf16_ss<16>(float (&d)[16][4], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      MD_WGMMA_REGS64 "}, %64, %65, p, 1, 1, 0, 0;\n}"
      : MD_WGMMA_ACC16(d)
      : "l"(a_desc), "l"(b_desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs_tb<8>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                     int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      MD_WGMMA_REGS32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}"
      : MD_WGMMA_ACC8(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs_tb<16>(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                     int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      MD_WGMMA_REGS64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
      : MD_WGMMA_ACC16(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
}

}  // namespace megadecode::cuda::ptx
