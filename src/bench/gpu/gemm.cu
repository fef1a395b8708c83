// `megadecode bench bandwidth` and `megadecode bench gemm`: the pure-read ceiling, and our skinny
// GEMM against cuBLAS (bf16 in, fp32 out, same inputs) at the model's shapes. Timing: CUDA events
// around a CUDA graph of launches that rotate over several weight copies (so L2, 60 MB, never holds
// the weights), warm-up first, median of the replays.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/gpu/bandwidth.h"
#include "bench/gpu/event_timer.h"
#include "bench/gpu/stream.h"
#include "core/args.h"
#include "core/check.h"
#include "core/json_file.h"
#include "core/rng.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "cuda/common/kernels.h"
#include "cuda/common/weight_pack.cuh"

namespace megadecode {
namespace {

#define CUBLAS_CHECK(expr)                                                                \
  do {                                                                                    \
    cublasStatus_t st_ = (expr);                                                          \
    MD_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #expr, " failed with cuBLAS status ", int(st_)); \
  } while (0)

__global__ void fill_uniform_bf16(uint16_t* out, size_t n, uint64_t seed, uint64_t stream_id, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = float_to_bf16_bits(scale * uniform_at(seed, stream_id, i));
}
void fill_uniform(uint16_t* out, size_t n, uint64_t seed, uint64_t stream_id, float scale) {
  fill_uniform_bf16<<<1024, 256>>>(out, n, seed, stream_id, scale);
  CUDA_CHECK_LAST();
}

// Captures `body(i)` for i in [0, n) into one graph.
template <typename F>
cudaGraphExec_t capture(cudaStream_t stream, int n, F body) {
  cudaGraph_t g;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) body(i);
  CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  CUDA_CHECK(cudaGraphDestroy(g));
  return exec;
}

nlohmann::json device_json() {
  const auto info = cuda::device_info();
  return {{"name", info.name}, {"sms", info.n_sms}, {"l2_bytes", info.l2_bytes}};
}

struct Shape {
  const char* name;
  int n, k;
};

}  // namespace

int bench_bandwidth(int argc, char** argv) {
  Args args(argc, argv, {"json", "gib", "reps"}, {});
  MD_REQUIRE(cuda::gpu_available(), "bench bandwidth: no CUDA GPU");
  const size_t bytes = size_t(args.get_double("gib", 4.0) * (1ull << 30)) / 16 * 16;
  const int reps = static_cast<int>(args.get_int("reps", 20));
  std::printf("pure-read bandwidth over %.2f GiB, median of %d:\n", double(bytes) / (1ull << 30), reps);
  nlohmann::json configs = nlohmann::json::array();
  const double best = cuda::measure_read_ceiling(bytes, reps, configs, true);
  std::printf("ceiling: %.1f GB/s\n", best);
  // The megakernel's page stream alone (bench/gpu/stream.h): bulk copies into a ring per SM.
  std::printf("page stream (cp.async.bulk into a shared-memory ring, one loader thread per SM), median of 5:\n");
  nlohmann::json streams = nlohmann::json::array();
  struct Case {
    const char* what;
    int n_sms, page_kb, slots;
    bool l2;
    int consumer;
  };
  const Case cases[] = {
      {"1 SM, HBM", 1, 16, 2, false, cuda::kStreamTouch},       {"1 SM, HBM", 1, 16, 4, false, cuda::kStreamTouch},
      {"1 SM, HBM", 1, 32, 4, false, cuda::kStreamTouch},       {"1 SM, HBM", 1, 32, 6, false, cuda::kStreamTouch},
      {"all SMs, HBM", 0, 16, 2, false, cuda::kStreamTouch},    {"all SMs, HBM", 0, 16, 4, false, cuda::kStreamTouch},
      {"all SMs, HBM", 0, 32, 2, false, cuda::kStreamTouch},    {"all SMs, HBM", 0, 32, 4, false, cuda::kStreamTouch},
      {"all SMs, HBM", 0, 32, 6, false, cuda::kStreamTouch},    {"1 SM, L2", 1, 32, 4, true, cuda::kStreamTouch},
      {"all SMs, L2", 0, 32, 4, true, cuda::kStreamTouch},      {"all SMs, L2", 0, 32, 6, true, cuda::kStreamTouch},
      {"1 SM, release", 1, 16, 5, false, cuda::kStreamRelease}, {"1 SM, gemm", 1, 16, 5, false, cuda::kStreamGemm},
      {"1 SM, gemm+red", 1, 16, 5, false, cuda::kStreamGemmReduce},
      {"1 SM, L2 gemm+red", 1, 16, 5, true, cuda::kStreamGemmReduce},
      {"all, release", 0, 16, 5, false, cuda::kStreamRelease},  {"all, gemm", 0, 16, 5, false, cuda::kStreamGemm},
      {"all, gemm+red", 0, 16, 5, false, cuda::kStreamGemmReduce},
      {"all, gemm+red", 0, 16, 8, false, cuda::kStreamGemmReduce}};
  for (const Case& k : cases) {
    cuda::StreamShape sh;
    sh.consumer = k.consumer;
    sh.n_sms = k.n_sms;
    sh.page_bytes = k.page_kb << 10;
    sh.slots = k.slots;
    sh.bytes_per_sm = size_t(k.n_sms == 1 ? 256 : 24) << 20;
    sh.region_bytes = k.l2 ? size_t(sh.slots) * sh.page_bytes * 2 : sh.bytes_per_sm;
    const cuda::StreamResult r = cuda::measure_stream(sh, 5);
    const int kb = k.page_kb * k.slots;
    std::printf("  %-17s %2d KB pages x %d (%3d KB in flight): %7.1f GB/s per SM, %7.1f GB/s in all (%d SMs)\n",
                k.what, k.page_kb, k.slots, kb, r.gbps_per_sm, r.gbps_total, r.n_sms);
    streams.push_back({{"what", k.what}, {"n_sms", r.n_sms}, {"page_kb", k.page_kb}, {"slots", k.slots},
                       {"l2", k.l2}, {"consumer", k.consumer}, {"bytes_per_sm", sh.bytes_per_sm}, {"ms", r.ms},
                       {"gbps_per_sm", r.gbps_per_sm}, {"gbps_total", r.gbps_total}});
  }
  if (args.has("json"))
    write_json(args.get("json", ""), {{"bench", "bandwidth"}, {"device", device_json()}, {"bytes", bytes},
                                      {"configs", configs}, {"ceiling_gbps", best}, {"page_stream", streams}});
  return 0;
}

int bench_gemm(int argc, char** argv) {
  Args args(argc, argv, {"json", "batch", "reps", "rotate-mb"}, {});
  MD_REQUIRE(cuda::gpu_available(), "bench gemm: no CUDA GPU");
  const auto batches = args.get_int_list("batch", {1, 8, 64});
  const int reps = static_cast<int>(args.get_int("reps", 50));
  const double rotate_bytes = args.get_double("rotate-mb", 512) * 1e6;
  for (auto b : batches) MD_REQUIRE(b >= 1 && b <= 64, "--batch values must be in 1..64, got ", b);
  MD_REQUIRE(reps >= 1, "--reps must be positive");

  nlohmann::json ceiling_cfg = nlohmann::json::array();
  const double ceiling = cuda::measure_read_ceiling(size_t(2) << 30, 10, ceiling_cfg, false);
  std::printf("read ceiling %.1f GB/s (best of %zu configs)\n", ceiling, ceiling_cfg.size());

  const Shape shapes[] = {{"qkv", 5120, 2048},   {"o_proj", 2048, 4096}, {"expert_gate_up", 1536, 2048},
                          {"expert_down", 2048, 768}, {"router", 128, 2048}, {"lm_head", 151936, 2048}};
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  void* cublas_ws = nullptr;
  const size_t ws_bytes = 64ull << 20;
  CUDA_CHECK(cudaMalloc(&cublas_ws, ws_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(handle, cublas_ws, ws_bytes));

  nlohmann::json records = nlohmann::json::array();
  std::printf("%-15s %5s %3s | %9s %8s %6s | %9s %8s %6s | %7s %9s\n", "shape", "N", "B", "ours us", "GB/s", "%ceil",
              "cublas us", "GB/s", "%ceil", "speedup", "max rdiff");
  for (const Shape& s : shapes) {
    const size_t w_elems = size_t(s.n) * s.k;
    const size_t w_bytes = w_elems * 2;
    const int copies = static_cast<int>(std::clamp<double>(std::ceil(rotate_bytes / double(w_bytes)), 2, 64));
    std::vector<uint16_t*> packed(copies), rowmajor(copies);
    for (int c = 0; c < copies; ++c) {
      CUDA_CHECK(cudaMalloc(&packed[c], cuda::packed_elements(s.n, s.k) * 2));
      CUDA_CHECK(cudaMalloc(&rowmajor[c], w_bytes));
      fill_uniform(rowmajor[c], w_elems, 1234, 100 + c, 0.05f);  // legacy stream: sync before packing
      CUDA_CHECK(cudaDeviceSynchronize());
      cuda::pack_weight(rowmajor[c], packed[c], s.n, s.k, stream);
    }
    uint16_t* x = nullptr;
    float *y_ours = nullptr, *y_ref = nullptr;
    CUDA_CHECK(cudaMalloc(&x, size_t(64) * s.k * 2));
    CUDA_CHECK(cudaMalloc(&y_ours, size_t(64) * s.n * 4));
    CUDA_CHECK(cudaMalloc(&y_ref, size_t(64) * s.n * 4));
    fill_uniform(x, size_t(64) * s.k, 99, 1, 1.0f);
    CUDA_CHECK(cudaDeviceSynchronize());

    for (int64_t b : batches) {
      const int nb = static_cast<int>(b);
      auto ours = [&](int c, float* y) {
        cuda::SkinnyGemmArgs a{packed[c], x, y, s.n, s.k, nb, s.k, s.n};
        cuda::skinny_gemm(a, stream);
      };
      const float alpha = 1.0f, beta = 0.0f;
      auto theirs = [&](int c, float* y) {
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.n, nb, s.k, &alpha, rowmajor[c], CUDA_R_16BF,
                                  s.k, x, CUDA_R_16BF, s.k, &beta, y, CUDA_R_32F, s.n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      };
      // Same inputs, same answer (up to summation order).
      ours(0, y_ours);
      theirs(0, y_ref);
      std::vector<float> h_ours(size_t(nb) * s.n), h_ref(size_t(nb) * s.n);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaMemcpy(h_ours.data(), y_ours, h_ours.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(h_ref.data(), y_ref, h_ref.size() * 4, cudaMemcpyDeviceToHost));
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < h_ref.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double(h_ours[i]) - h_ref[i]));
        max_ref = std::max(max_ref, std::fabs(double(h_ref[i])));
      }
      const double rdiff = std::isfinite(max_err) ? max_err / std::max(max_ref, 1e-30) : INFINITY;

      auto g_ours = capture(stream, copies, [&](int c) { ours(c, y_ours); });
      auto g_theirs = capture(stream, copies, [&](int c) { theirs(c, y_ref); });
      auto replay = [&](cudaGraphExec_t g) {
        return cuda::median_event_ms(stream, 3, reps, [&] { CUDA_CHECK(cudaGraphLaunch(g, stream)); }) / copies;
      };
      const double ms_ours = replay(g_ours), ms_theirs = replay(g_theirs);
      CUDA_CHECK(cudaGraphExecDestroy(g_ours));
      CUDA_CHECK(cudaGraphExecDestroy(g_theirs));

      const double bytes = double(w_bytes) + double(nb) * s.k * 2 + double(nb) * s.n * 4;
      const double gb_ours = bytes / (ms_ours * 1e-3) / 1e9, gb_theirs = bytes / (ms_theirs * 1e-3) / 1e9;
      std::printf("%-15s %5d %3d | %9.2f %8.1f %5.1f%% | %9.2f %8.1f %5.1f%% | %6.2fx %9.2e\n", s.name, s.n, nb,
                  ms_ours * 1e3, gb_ours, 100 * gb_ours / ceiling, ms_theirs * 1e3, gb_theirs,
                  100 * gb_theirs / ceiling, ms_theirs / ms_ours, rdiff);
      records.push_back({{"shape", s.name}, {"n", s.n}, {"k", s.k}, {"batch", nb}, {"bytes", bytes},
                         {"weight_copies", copies}, {"ours_us", ms_ours * 1e3}, {"ours_gbps", gb_ours},
                         {"ours_pct_of_ceiling", 100 * gb_ours / ceiling}, {"cublas_us", ms_theirs * 1e3},
                         {"cublas_gbps", gb_theirs}, {"cublas_pct_of_ceiling", 100 * gb_theirs / ceiling},
                         {"speedup_vs_cublas", ms_theirs / ms_ours}, {"max_rel_diff_vs_cublas", rdiff}});
    }
    for (int c = 0; c < copies; ++c) {
      CUDA_CHECK(cudaFree(packed[c]));
      CUDA_CHECK(cudaFree(rowmajor[c]));
    }
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y_ours));
    CUDA_CHECK(cudaFree(y_ref));
  }
  CUBLAS_CHECK(cublasDestroy(handle));
  CUDA_CHECK(cudaFree(cublas_ws));
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (args.has("json"))
    write_json(args.get("json", ""), {{"bench", "gemm"}, {"device", device_json()}, {"ceiling_gbps", ceiling},
                                      {"ceiling_configs", ceiling_cfg}, {"reps", reps}, {"records", records}});
  return 0;
}

}  // namespace megadecode
