// The one policy that picks a decode step's path: the megakernel (one persistent kernel, the
// latency path: best while each weight page serves a few rows) or the batched step (the many-row
// GEMM engine, the throughput path: each expert's weights read once for all its rows). Chosen per
// step from the batch, at the crossover measured by `bench decode` on the H200
// (bench/results/decode-h200.json, docs/perf/notes.md). Backends that have both paths ask it;
// nothing else decides.
#pragma once

#include <string>

namespace megadecode {

enum class DecodePath { kMegakernel, kBatched };

struct DecodePathPolicy {
  // Batches of at least this many sequences run the batched step.
  int batched_from_batch = kMeasuredCrossover;
  // The megakernel's largest batch (its token groups); larger batches always run batched.
  int megakernel_max_batch = 64;

  // The H200 crossover at context 8192: the smallest batch at which the batched step is faster than
  // the megakernel (bench/results/decode-h200.json, device call 4: batch 2 megakernel 6.36 ms vs
  // batched 7.05; batch 4 10.52 vs 8.50).
  static constexpr int kMeasuredCrossover = 4;

  DecodePath choose(int batch) const {
    return batch >= batched_from_batch || batch > megakernel_max_batch ? DecodePath::kBatched
                                                                       : DecodePath::kMegakernel;
  }
};

inline std::string decode_path_name(DecodePath p) { return p == DecodePath::kBatched ? "batched" : "megakernel"; }

}  // namespace megadecode
