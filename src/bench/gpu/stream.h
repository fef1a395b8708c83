// The megakernel's page stream measured alone (stream.cu): bulk copies into a shared-memory ring
// per SM, from HBM or from L2, with one SM or all of them active.
#pragma once

#include <cstddef>

namespace megadecode::cuda {

// What consumes the pages (each adds a part of the megakernel's GEMM consumer, cuda/megakernel/gemm.cuh):
enum StreamConsumer : int {
  kStreamTouch = 0,       // one warp reads a word of each page (the bare stream)
  kStreamRelease = 1,     // the batch-1 GEMM page (16 KB weights + 1 KB activations, two bulk copies);
                          // 8 warps each read a word, fence.proxy.async and release it
  kStreamGemm = 2,        // ... and run the MMAs (gemm_consume_stage)
  kStreamGemmReduce = 3,  // ... and reduce the 8 warps' partials every 16-row block (4 pages)
  kStreamGemmNoFence = 4,   // kStreamGemm without the fence.proxy.async before each release
  kStreamGemmUnrolled = 5,  // kStreamGemm with the page's k loop unrolled (its loads issued ahead)
};

struct StreamShape {
  int consumer = kStreamTouch;
  int n_sms = 0;          // active SMs (0: all)
  int page_bytes = 32768;  // kStreamTouch only (the GEMM pages are the batch-1 megakernel page)
  int slots = 4;          // pages in flight per SM at most
  size_t region_bytes;    // bytes each SM's pages wrap around in (smaller than bytes_per_sm: the
                          // re-reads hit L2, and the pages are loaded evict-last)
  size_t bytes_per_sm;    // bytes each SM streams
};

struct StreamResult {
  double ms = 0;  // median launch time
  double gbps_per_sm = 0;
  double gbps_total = 0;
  int n_sms = 0;
};

// Median of `reps` launches (after one untimed).
StreamResult measure_stream(const StreamShape& shape, int reps);

}  // namespace megadecode::cuda
