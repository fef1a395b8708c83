// The GPU side of `megadecode bench decode` (implemented in src/bench/gpu/decode_gpu.cu;
// this header has no CUDA types so the driver in bench_decode.cpp stays plain C++): device facts,
// the synthetic full-shape weights generated on the device, and one backend at a time
// (cuda, cuda-mk, cuda-ops or cuda-batched, a plan policy, kernel ablation flags) over a synthetic KV cache filled
// with N(0, 0.01), timed by replaying one decode step as a CUDA graph between CUDA events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/megakernel/trace.h"
#include "engine/backend.h"
#include "model/config.h"
#include "plan/plan.h"

namespace megadecode {

struct GpuInfo {
  std::string name;
  int n_sms = 0;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};
GpuInfo gpu_info();

struct DecodePointResult {
  std::string path;                    // the decode path that ran (megakernel or batched)
  std::vector<float> step_ms;          // each timed replay
  double chained_ms = 0;               // DecodePoint::chained_ms
  std::vector<std::pair<std::string, double>> kernel_ms;  // batched path: ms per kernel of one step
  std::vector<int> distinct_experts;   // [n_layers] from the step's routing (capture)
  std::vector<int> context_lens;       // [batch]
  int n_sms = 0;
  std::vector<TraceRecord> trace;      // when asked for
  int64_t trace_dropped = 0;
  Plan plan;                           // the step's plan (trace names), only when tracing
};

class DecodeGpu {
 public:
  // Generates the model's weights on the device (synthetic, `seed`); prints how long it took.
  DecodeGpu(const ModelConfig& config, uint64_t seed);
  ~DecodeGpu();
  DecodeGpu(const DecodeGpu&) = delete;
  DecodeGpu& operator=(const DecodeGpu&) = delete;

  int64_t weight_bytes() const;
  // Opens one CUDA backend (closing the previous one) and fills its whole KV
  // cache with N(0, 0.01). options.n_kv_blocks must be set: the caller checked that it fits.
  void open(const BackendOptions& options);
  void close();
  // One decode step of `batch` sequences at context `context` (the new token at position
  // context - 1, random token ids, greedy), run once, then replayed warmup + steps times.
  // trace_capacity > 0: one more replay with the per-SM trace on (records per SM and role).
  DecodePointResult run(int batch, int context, int warmup, int steps, int trace_capacity);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megadecode
