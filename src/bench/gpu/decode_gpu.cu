// GPU side of `megadecode bench decode` (bench/decode_gpu.h): device facts, synthetic weights,
// the N(0, 0.01) KV fill, and timed decode steps on CudaBackend.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "bench/decode_bytes.h"
#include "bench/decode_gpu.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/stopwatch.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/backend/path_calibration.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"

namespace megadecode {
namespace {

// bf16 N(0, sd) by Box-Muller on two counter-based uniforms (the same values for the same seed).
__global__ void fill_normal_bf16(uint16_t* out, size_t n, uint64_t seed, float sd) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u1 = 0.5f * (uniform_at(seed, 1, i) + 1.0f) + 1e-7f;  // (0, 1]
    const float u2 = uniform_at(seed, 2, i);
    out[i] = float_to_bf16_bits(sd * sqrtf(-2.0f * logf(u1)) * cospif(u2));
  }
}

// The engine's overlapped loop without the server: decode_async steps whose rows take the previous
// step's tokens on the device, step N+1 launched before step N is collected; the wall time a step
// (every upload, copy, small kernel and host phase of a served step, which the graph replay of
// time_last_step leaves out). Each step writes the same KV slots (positions stay), as the replays do.
double chained_step_ms(cuda::CudaBackend& be, std::span<const DecodeSeq> seqs, int warmup, int steps) {
  std::vector<DecodeSeq> chained(seqs.begin(), seqs.end());
  for (size_t i = 0; i < chained.size(); ++i) {
    chained[i].chunk.tokens = {};
    chained[i].prev_row = static_cast<int>(i);
  }
  DecodeResult r;
  DecodeTicket in_flight = be.decode_async(seqs, false);
  Stopwatch clock;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) clock.restart();
    const DecodeTicket next = be.decode_async(chained, false);
    be.collect(in_flight, r);
    in_flight = next;
  }
  const double ms = clock.seconds() * 1e3 / steps;
  be.collect(in_flight, r);
  return ms;
}

}  // namespace

GpuInfo gpu_info() {
  MD_REQUIRE(cuda::gpu_available(), "bench decode needs a CUDA GPU and none is usable");
  const cuda::DeviceInfo d = cuda::device_info();
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {d.name, d.n_sms, static_cast<int64_t>(total_b), static_cast<int64_t>(free_b)};
}

struct DecodeGpu::Impl {
  ModelConfig config;
  uint64_t seed = 0;
  std::shared_ptr<const cuda::DeviceWeights> weights;
  std::unique_ptr<cuda::CudaBackend> backend;
  BackendOptions options;
};

DecodeGpu::DecodeGpu(const ModelConfig& config, uint64_t seed) : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  impl_->seed = seed;
  const Stopwatch t0;
  impl_->weights = cuda::DeviceWeights::synthetic(config, seed);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("weights: %.2f GB generated on the device in %.1f s (seed %llu)\n",
              static_cast<double>(impl_->weights->bytes()) / 1e9, t0.seconds(), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
}

DecodeGpu::~DecodeGpu() = default;

int64_t DecodeGpu::weight_bytes() const { return static_cast<int64_t>(impl_->weights->bytes()); }

void DecodeGpu::close() {
  impl_->backend.reset();
  CUDA_CHECK(cudaDeviceSynchronize());
}

void DecodeGpu::open(const BackendOptions& options) {
  close();
  MD_REQUIRE(options.n_kv_blocks >= 1, "KV cache of ", options.n_kv_blocks, " blocks");
  impl_->backend = std::make_unique<cuda::CudaBackend>(impl_->weights, options);
  impl_->options = options;
  cuda::CudaBackend& be = *impl_->backend;
  const size_t n = be.kv_cache_elements();
  fill_normal_bf16<<<4096, 256>>>(be.kv_cache(), n, impl_->seed ^ 0x6b76ull, 0.01f);
  CUDA_CHECK_LAST();
  if (be.kv_ring() != nullptr) {  // the sliding layers' ring pool, alike
    fill_normal_bf16<<<4096, 256>>>(be.kv_ring(), be.kv_ring_elements(), impl_->seed ^ 0x7269ull, 0.01f);
    CUDA_CHECK_LAST();
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  if (options.backend == "cuda") {  // the engine's per-step choice, measured as serve measures it
    const cuda::PathCalibration cal = cuda::calibrate_decode_path(be, impl_->seed + 1);
    std::printf("  cuda: decode path %s\n", cal.summary().c_str());
    std::fflush(stdout);
  }
}

DecodePointResult DecodeGpu::run(int batch, int context, int warmup, int steps, int trace_capacity) {
  MD_REQUIRE(impl_->backend != nullptr, "bench decode: no backend open");
  cuda::CudaBackend& be = *impl_->backend;
  const ModelConfig& c = impl_->config;
  const int bs = impl_->options.kv_block_size;
  const int64_t per_seq = (context + bs - 1) / bs;
  MD_REQUIRE(batch >= 1 && context >= 1 && context <= c.max_position_embeddings, "bench decode: batch ", batch,
             " context ", context, " (max position ", c.max_position_embeddings, ")");
  MD_REQUIRE(per_seq * batch <= be.n_kv_blocks(), "bench decode: batch ", batch, " x context ", context, " needs ",
             per_seq * batch, " KV blocks, the cache has ", be.n_kv_blocks());
  // Sliding-window layers: sequence i owns ring blocks [i * r, (i + 1) * r), r = min(R, per_seq).
  const int ring_len = be.ring_length();
  const int64_t ring_per_seq = std::min<int64_t>(ring_len, per_seq);
  MD_REQUIRE(ring_per_seq * batch <= be.n_ring_blocks(), "bench decode: batch ", batch, " x context ", context,
             " needs ", ring_per_seq * batch, " KV ring blocks, the ring pool has ", be.n_ring_blocks());
  std::vector<std::vector<int32_t>> rings(batch);
  // Sequence i owns blocks [i * per_seq, (i + 1) * per_seq); random distinct-ish tokens.
  std::vector<std::vector<int32_t>> tables(batch);
  std::vector<int32_t> tokens(batch);
  SplitMix64 rng(impl_->seed * 1000003ull + static_cast<uint64_t>(batch) * 7919ull + static_cast<uint64_t>(context));
  std::vector<DecodeSeq> seqs(batch);
  DecodePointResult out;
  for (int i = 0; i < batch; ++i) {
    tables[i].resize(per_seq);
    for (int64_t j = 0; j < per_seq; ++j) tables[i][j] = static_cast<int32_t>(i * per_seq + j);
    tokens[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(c.vocab_size));
    seqs[i].chunk.seq_id = i;
    seqs[i].chunk.tokens = std::span<const int32_t>(&tokens[i], 1);
    seqs[i].chunk.start_pos = context - 1;
    seqs[i].chunk.block_table = tables[i];
    for (int64_t j = 0; j < ring_per_seq; ++j) rings[i].push_back(static_cast<int32_t>(i * ring_per_seq + j));
    seqs[i].chunk.ring_table = rings[i];
    seqs[i].sampling.temperature = 0.0f;
    out.context_lens.push_back(context);
  }
  DecodeResult r;
  RoutingLog routing(c.n_layers, c.n_experts_per_tok);  // the step's routing, for its expert bytes
  be.set_routing_capture(&routing);
  be.decode(seqs, false, r);
  be.set_routing_capture(nullptr);
  be.decode(seqs, false, r);  // again without capture: cuda-ops replays the graph of its last decode
  out.step_ms = be.probe().time_last_step(warmup, steps);
  out.chained_ms = chained_step_ms(be, seqs, warmup, steps);
  out.n_sms = be.n_sms();
  out.path = decode_path_name(be.last_path());
  out.kernel_ms = be.probe().profile_last_step();
  out.distinct_experts = distinct_experts(routing, c);
  if (trace_capacity > 0) {
    MD_REQUIRE(be.last_path() == DecodePath::kMegakernel, "bench decode: the trace is the megakernel's");
    be.probe().enable_trace(trace_capacity);
    be.decode(seqs, false, r);      // re-plans and (cuda-ops) re-captures with the trace on
    (void)be.probe().time_last_step(2, 1);  // the last replay's records stay in the buffer
    out.trace = be.probe().read_trace(&out.trace_dropped);
    out.plan = be.probe().last_plan();
    be.probe().enable_trace(0);
  }
  return out;
}

}  // namespace megadecode
