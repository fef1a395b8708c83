// Options of `megadecode bench decode` and the memory plan of a run: parsed and checked on the
// host (unit-tested without a GPU); the run itself is src/bench/gpu/decode_run.cu.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "model/config.h"

namespace megadecode {

extern const char* const kDecodeBenchUsage;

struct DecodeBenchOptions {
  bool help = false;
  std::string preset = "qwen3-30b-a3b";
  ModelConfig config;  // the preset; max_position_embeddings raised to the longest context asked for
  std::vector<std::pair<int, int>> points;  // (context, batch): the --context x --batch grid, then --points
  int steps = 100;
  int warmup = 10;
  uint64_t seed = 1;  // fixed by default: runs are comparable
  // The main sweep's backend options (kv_block_size, policy; backend and n_kv_blocks
  // are set per run). The ablations vary them from here.
  BackendOptions backend;
  // Full names, in the order measured: cuda-mk, cuda-ops (batches <= 64), cuda-batched, and cuda
  // (the engine's per-step choice between the two paths).
  std::vector<std::string> backends = {"cuda-mk", "cuda-ops", "cuda-batched", "cuda"};
  bool ablations = false;
  std::vector<int> ablation_batches = {1, 8};
  std::string trace_path;  // "" : no trace
  int trace_batch = 1;
  std::string json_path;
  int64_t ceiling_mib = 4096;
  std::string command;  // the command line, for the JSON

  // KV blocks the main backends hold (largest point, the traced one included) and the ablation
  // backends hold (ablation batches at the first context); one backend lives at a time.
  int64_t main_blocks() const;
  int64_t ablation_blocks() const;
  int64_t block_bytes() const;  // one block of the full pool (engine/kv_pools.h): every full-attention layer
  // Models with sliding-window layers: the ring pool's blocks (the largest point's need, a
  // sequence holding min(R, its blocks) of them) and the bytes of one ring block over the sliding
  // layers; 0 without.
  int64_t ring_blocks() const;
  int64_t ring_block_bytes() const;
};

// Error naming the flag for anything out of range.
DecodeBenchOptions parse_decode_bench_args(int argc, char** argv);

inline constexpr int kDecodeBenchMaxContext = 1 << 20;
inline constexpr int kDecodeBenchMegakernelMaxBatch = 64;  // cuda-mk and cuda-ops rows stop here
inline constexpr int64_t kDecodeBenchReserveBytes = int64_t{2} << 30;  // arena, plans, graphs, trace

// "" when weights + the largest KV cache of the run + the reserve fit in `free_bytes`; else a
// message naming the points that do not fit.
std::string decode_memory_problem(const DecodeBenchOptions& o, int64_t free_bytes);

}  // namespace megadecode
