// Options of `megadecode bench prefill` (parsed and checked on the host, unit-tested without a
// GPU) and the arithmetic the report uses: flops of a prefill piece on a model shape. The run
// itself is src/bench/gpu/prefill_run.cu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "model/config.h"

namespace megadecode {

extern const char* const kPrefillBenchUsage;

struct PrefillBenchOptions {
  bool help = false;
  std::string preset = "qwen3-30b-a3b";
  ModelConfig config;          // the preset; max_position_embeddings raised to the longest prompt
  std::vector<int> lengths = {1024, 8192, 16384};
  // The backend's options with their one set of defaults: backend cuda-mk, prefill_chunk the
  // piece size (--prefill-chunk, >= 1 here), kv_block_size (--block-size); n_kv_blocks per run.
  BackendOptions backend{.backend = "cuda-mk"};
  int reps = 3;
  int warmup = 1;
  uint64_t seed = 1;
  bool one_token = false;      // also time the one-token decode path (prefill_chunk = 0) at the first length
  std::string json_path;
  std::string command;
};

PrefillBenchOptions parse_prefill_bench_args(int argc, char** argv);

// Multiply-add flops (2 per MAC) of tokens at positions [start, start + n): the projections each
// token runs (QKV, O, and the router and top-k experts' gate/up/down, or a dense layer's MLP) and
// causal attention (QK^T and PV over keys [0, pos], a sliding layer's last W of them) in every
// layer; the LM head of the last token.
double prefill_flops(const ModelConfig& c, int64_t start, int64_t n);
// Its causal attention term alone (QK^T and PV of every layer): what `bench prefill` divides each
// piece's attention time by.
double prefill_attention_flops(const ModelConfig& c, int64_t start, int64_t n);

}  // namespace megadecode
