// The megakernel's shared memory, one CTA per SM (kNT = token groups of 8: batch <= 8 * kNT):
//   barriers | GEMM fill | routing tables | GEMM reduction | union { attention scratch | sampler
//   scratch | activation area } | page ring (32 KB slots, as many as fit)
// The activation area holds a GEMM job's activation rows (bf16, plan/gemm_geometry.h windows), each row's RMSNorm
// scale, the expert-down combine store and (batch <= 32) the second reduction buffer. Only the
// consumers touch the union; the loader touches only the ring and the routing tables (read).
#pragma once

#include <cstdint>

#include "cuda/common/sampling.cuh"
#include "cuda/megakernel/activation.cuh"
#include "cuda/megakernel/attention.cuh"
#include "plan/gemm_geometry.h"
#include "cuda/megakernel/routing.cuh"

namespace megadecode::cuda::mk {

constexpr int kMaxSlots = 8;
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int round128(int x) { return (x + 127) / 128 * 128; }

using SampleScratch = RowSampleScratch<kConsumerThreads>;

template <int kNT>
struct Smem {
  static constexpr int kMaxRows = 8 * kNT;  // token positions of a job
  // Row blocks a page may stack (the consumers' accumulators: kPageRbMax x kNT x 4 floats).
  static constexpr int kPageRbMax = kNT <= 2 ? 4 : (kNT <= 4 ? 2 : 1);
  static constexpr int kRedPitch = 17;  // floats per token row of a warp's 16-row partial
  static constexpr int kRedBytes = kConsumerWarps * 8 * kNT * kRedPitch * 4;

  static constexpr int kBarOffset = 0;  // full[kMaxSlots], empty[kMaxSlots], route
  static constexpr int kFillOffset = 256;  // the current GEMM task's Fill
  static constexpr int kRouteOffset = kFillOffset + round128(static_cast<int>(sizeof(Fill)));
  static constexpr int kRedOffset = kRouteOffset + round128(static_cast<int>(sizeof(RouteSmem)));
  static constexpr int kUnionOffset = kRedOffset + round128(kRedBytes);

  // The activation area inside the union.
  static constexpr int kScaleOffset = 0;                              // float[kMaxRows]
  static constexpr int kCombineOffset = round128(kScaleOffset + kMaxRows * 4);  // float[kMaxRows][kMaxTopK][16]
  // (An LM head tile keeps its LogitBest[kMaxRows * 16] there: ops.cuh lm_head_best.)
  static_assert(kMaxTopK * 4 >= static_cast<int>(sizeof(LogitBest)), "the combine store must hold the LM head's LogitBest");
  // The second GEMM reduction buffer (gemm.cuh RedBuffers) where the union has room for it (batch
  // <= 32; at 64 it would cost a ring slot, and the one buffer is reused with a barrier); -1: none.
  static constexpr bool kTwoRedBuffers = kNT <= 4;
  static constexpr int kRed2Offset = kTwoRedBuffers ? kCombineOffset + round128(kMaxRows * kMaxTopK * 16 * 4) : -1;
  static constexpr int kActOffset =
      kCombineOffset + round128(kMaxRows * kMaxTopK * 16 * 4) + (kTwoRedBuffers ? round128(kRedBytes) : 0);
  static constexpr int kUnionBytes =
      round128(cmax(cmax(static_cast<int>(sizeof(AttnScratch)), static_cast<int>(sizeof(SampleScratch))),
                    kActOffset + 64 * 1024));
  static constexpr int kActBytes = kUnionBytes - kActOffset;  // activation rows

  static constexpr int kRingOffset = kUnionOffset + kUnionBytes;

  // The host's geometry (and the timing model) take this layout from plan/gemm_geometry.h.
  static_assert(megakernel_layout(kNT).act_bytes == kActBytes && megakernel_layout(kNT).page_rb_max == kPageRbMax,
                "plan/gemm_geometry.h kMegakernelLayouts must hold this instantiation's activation area and page rows");
};

// What every consumer routine of a CTA shares.
struct Ring {
  uint8_t* pages;
  int n_slots;
  uint64_t* full;   // [n_slots] the loader's copies landed
  uint64_t* empty;  // [n_slots] the 8 consumer warps released it
};

}  // namespace megadecode::cuda::mk
