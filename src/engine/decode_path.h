// The one policy that picks a decode step's path: the megakernel (one persistent kernel, the
// latency path: best while each weight page serves a few rows) or the batched step (the many-row
// GEMM engine, the throughput path: each expert's weights read once for all its rows). Chosen per
// step from the batch. The crossover depends on the model and the GPU (H100, 8K: qwen3-30b-a3b runs
// batched from batch 3, north-mini-code from 4; bench/results/decode-mk-*-h100-call2.json), so a
// backend with both paths measures it when it starts (cuda/backend/path_calibration.h:
// crossover_from over both paths' step times at batches 1..8) and sets it here; the default below
// holds until then. Backends that have both paths ask it; nothing else decides.
#pragma once

#include <span>
#include <string>

namespace megadecode {

enum class DecodePath { kMegakernel, kBatched };

struct DecodePathPolicy {
  // Batches of at least this many sequences run the batched step.
  int batched_from_batch = kDefaultCrossover;
  // The megakernel's largest batch (its token groups); larger batches always run batched.
  int megakernel_max_batch = 64;

  // Before (or without) a measurement: the H200 crossover at context 8192 (tests/data/
  // decode-h200.json, device call 4: batch 2 megakernel 6.36 ms vs batched 7.05; batch 4 10.52 vs 8.50).
  static constexpr int kDefaultCrossover = 4;

  DecodePath choose(int batch) const {
    return batch >= batched_from_batch || batch > megakernel_max_batch ? DecodePath::kBatched
                                                                       : DecodePath::kMegakernel;
  }

  // The crossover from measured step times of the two paths at batches 1..n (index b - 1): the
  // smallest batch from which the batched step is faster at every measured batch; n + 1 when the
  // megakernel is faster at batch n (the batched step is faster beyond the measured range: its
  // weight reads do not grow with the rows). Error when the two spans differ in length or are empty,
  // or a time is not positive.
  static int crossover_from(std::span<const double> megakernel_ms, std::span<const double> batched_ms);
};

inline std::string decode_path_name(DecodePath p) { return p == DecodePath::kBatched ? "batched" : "megakernel"; }

}  // namespace megadecode
