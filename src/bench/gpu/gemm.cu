// `megadecode bench bandwidth` and `megadecode bench gemm`: the pure-read ceiling, and the many-row
// GEMM engine (cuda/gemm) against cuBLAS (bf16 in, fp32 out, same inputs) at the model's shapes:
// dense projections at 8..2048 rows, and the grouped expert GEMMs at 1..128 rows per expert
// against one cuBLAS call per expert. Timing: CUDA events
// around a CUDA graph of launches that rotate over several weight copies (so L2, 60 MB, never holds
// the weights), warm-up first, median of the replays.
#include <algorithm>
#include <cmath>
#include <functional>
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
#include "cuda/batched/batched_step.h"
#include "cuda/gemm/gemm.h"

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
      {"1 SM, L2 release", 1, 16, 5, true, cuda::kStreamRelease},
      {"1 SM, L2 gemm", 1, 16, 5, true, cuda::kStreamGemm},
      {"1 SM, L2 gemm, no fence", 1, 16, 5, true, cuda::kStreamGemmNoFence},
      {"1 SM, L2 gemm, unrolled", 1, 16, 5, true, cuda::kStreamGemmUnrolled},
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

namespace {

// One measured pair (ours, cuBLAS) of a GEMM shape: times, bytes, the checks' difference.
struct Measured {
  double ms_ours = 0, ms_cublas = 0, bytes = 0, flops = 0, rdiff = 0;
};

nlohmann::json record_json(const Measured& m, double ceiling) {
  const double gb_o = m.bytes / (m.ms_ours * 1e-3) / 1e9, gb_c = m.bytes / (m.ms_cublas * 1e-3) / 1e9;
  return {{"bytes", m.bytes},
          {"flops", m.flops},
          {"ours_us", m.ms_ours * 1e3},
          {"ours_gbps", gb_o},
          {"ours_pct_of_ceiling", 100 * gb_o / ceiling},
          {"ours_tflops", m.flops / (m.ms_ours * 1e-3) / 1e12},
          {"cublas_us", m.ms_cublas * 1e3},
          {"cublas_gbps", gb_c},
          {"cublas_pct_of_ceiling", 100 * gb_c / ceiling},
          {"cublas_tflops", m.flops / (m.ms_cublas * 1e-3) / 1e12},
          {"speedup_vs_cublas", m.ms_cublas / m.ms_ours},
          {"max_rel_diff_vs_cublas", m.rdiff}};
}

void print_row(const char* name, int n, int rows, const Measured& m, double ceiling) {
  const double gb_o = m.bytes / (m.ms_ours * 1e-3) / 1e9, gb_c = m.bytes / (m.ms_cublas * 1e-3) / 1e9;
  std::printf("%-15s %6d %5d | %9.2f %8.1f %5.1f%% %6.1f | %9.2f %8.1f %5.1f%% %6.1f | %6.2fx %9.2e\n", name, n, rows,
              m.ms_ours * 1e3, gb_o, 100 * gb_o / ceiling, m.flops / (m.ms_ours * 1e-3) / 1e12, m.ms_cublas * 1e3, gb_c,
              100 * gb_c / ceiling, m.flops / (m.ms_cublas * 1e-3) / 1e12, m.ms_cublas / m.ms_ours, m.rdiff);
}

double max_rel_diff(const float* a_dev, const float* b_dev, size_t n) {
  std::vector<float> a(n), b(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(a.data(), a_dev, n * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), b_dev, n * 4, cudaMemcpyDeviceToHost));
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(double(b[i])));
  }
  return std::isfinite(err) ? err / std::max(ref, 1e-30) : INFINITY;
}

}  // namespace

int bench_gemm(int argc, char** argv) {
  Args args(argc, argv, {"json", "rows", "rows-per-expert", "reps", "rotate-mb"}, {});
  MD_REQUIRE(cuda::gpu_available(), "bench gemm: no CUDA GPU");
  const auto rows_list = args.get_int_list("rows", {8, 16, 32, 64, 128, 256, 2048});
  const auto per_expert_list = args.get_int_list("rows-per-expert", {1, 2, 4, 8, 16, 64, 128});
  const int reps = static_cast<int>(args.get_int("reps", 30));
  const double rotate_bytes = args.get_double("rotate-mb", 512) * 1e6;
  for (auto r : rows_list) MD_REQUIRE(r >= 1 && r <= 8192, "--rows values must be in 1..8192, got ", r);
  for (auto r : per_expert_list) MD_REQUIRE(r >= 1 && r <= 512, "--rows-per-expert values must be in 1..512, got ", r);
  MD_REQUIRE(reps >= 1, "--reps must be positive");
  const int64_t max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  const int n_sms = cuda::sm_count();

  nlohmann::json ceiling_cfg = nlohmann::json::array();
  const double ceiling = cuda::measure_read_ceiling(size_t(2) << 30, 10, ceiling_cfg, false);
  std::printf("read ceiling %.1f GB/s (best of %zu configs)\n", ceiling, ceiling_cfg.size());

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  void* cublas_ws = nullptr;
  const size_t ws_bytes = 64ull << 20;
  CUDA_CHECK(cudaMalloc(&cublas_ws, ws_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(handle, cublas_ws, ws_bytes));
  const float alpha = 1.0f, beta = 0.0f;
  auto replay = [&](cudaGraphExec_t g, int per_graph) {
    return cuda::median_event_ms(stream, 3, reps, [&] { CUDA_CHECK(cudaGraphLaunch(g, stream)); }) / per_graph;
  };

  // ---- dense: the batched step's projections (with its K splits; rows past its 1024 unsplit, as a
  // prefill piece runs them) and the LM head ----
  nlohmann::json dense = nlohmann::json::array();
  const Shape shapes[] = {{"qkv", 5120, 2048}, {"o_proj", 2048, 4096}, {"router", 128, 2048}, {"lm_head", 151936, 2048}};
  std::printf("dense GEMMs (weights rotate over copies past the L2)\n");
  std::printf("%-15s %6s %5s | %9s %8s %6s %6s | %9s %8s %6s %6s | %7s %9s\n", "shape", "N", "rows", "ours us", "GB/s",
              "%ceil", "TF/s", "cublas us", "GB/s", "%ceil", "TF/s", "speedup", "max rdiff");
  for (const Shape& s : shapes) {
    const size_t w_elems = size_t(s.n) * s.k, w_bytes = w_elems * 2;
    const int copies = static_cast<int>(std::clamp<double>(std::ceil(rotate_bytes / double(w_bytes)), 1, 64));
    std::vector<uint16_t*> packed(copies), rowmajor(copies);
    for (int c = 0; c < copies; ++c) {
      CUDA_CHECK(cudaMalloc(&packed[c], cuda::packed_elements(s.n, s.k) * 2));
      CUDA_CHECK(cudaMalloc(&rowmajor[c], w_bytes));
      fill_uniform(rowmajor[c], w_elems, 1234, 100 + c, 0.05f);
      CUDA_CHECK(cudaDeviceSynchronize());
      cuda::pack_weight(rowmajor[c], packed[c], s.n, s.k, stream);
    }
    uint16_t* x = nullptr;
    float *y_ours = nullptr, *y_ref = nullptr, *split_ws = nullptr;
    int32_t* split_sem = nullptr;
    const int splits = cuda::gemm::dense_k_splits(s.n, s.k, n_sms);
    CUDA_CHECK(cudaMalloc(&x, size_t(max_rows) * s.k * 2));
    CUDA_CHECK(cudaMalloc(&y_ours, size_t(max_rows) * s.n * 4));
    CUDA_CHECK(cudaMalloc(&y_ref, size_t(max_rows) * s.n * 4));
    size_t n_ws = 1, n_sem = 1;
    for (int64_t r : rows_list) {
      const int tg = cuda::gemm::dense_tile_groups(s.n, static_cast<int>(r), splits, n_sms);
      n_ws = std::max(n_ws, cuda::gemm::workspace_floats(static_cast<int>(r), s.n, tg, splits));
      n_sem = std::max(n_sem, cuda::gemm::semaphore_count(static_cast<int>(r), s.n, tg));
    }
    CUDA_CHECK(cudaMalloc(&split_ws, n_ws * 4));
    CUDA_CHECK(cudaMalloc(&split_sem, n_sem * 4));
    CUDA_CHECK(cudaMemset(split_sem, 0, n_sem * 4));
    fill_uniform(x, size_t(max_rows) * s.k, 99, 1, 1.0f);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int64_t r64 : rows_list) {
      const int nb = static_cast<int>(r64);
      // Rows past the batched step's are a prefill piece's, which does not split K.
      const bool prefill = nb > cuda::batched::BatchedStep::kMaxRows;
      const int splits_r = prefill ? 1 : splits;
      // Our GEMM on weight copy c, nb rows into y_ours; `residual`: the kResidual epilogue over it.
      auto ours_args = [&](int c, const float* residual) {
        cuda::gemm::GemmArgs a;
        a.w = packed[c];
        a.n_rows = s.n;
        a.k = s.k;
        a.x = x;
        a.x_stride = s.k;
        a.n_tokens = nb;
        a.y = y_ours;
        a.y_stride = s.n;
        a.k_splits = splits_r;
        a.workspace = split_ws;
        a.semaphores = split_sem;
        a.residual = residual;
        a.residual_stride = residual != nullptr ? s.n : 0;
        return a;
      };
      auto ours = [&](int c) { cuda::gemm::gemm(ours_args(c, nullptr), cuda::gemm::Epilogue::kStore, stream); };
      // cuBLAS on weight copy c into y_ref (`b`: its beta, 1 to add to what y_ref holds).
      auto cublas = [&](int c, const float* b) {
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.n, nb, s.k, &alpha, rowmajor[c], CUDA_R_16BF,
                                  s.k, x, CUDA_R_16BF, s.k, b, y_ref, CUDA_R_32F, s.n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      };
      auto theirs = [&](int c) { cublas(c, &beta); };
      // One call of each on copy 0, their outputs compared; then each timed over the copies.
      auto time_pair = [&](const auto& our_call, const auto& their_call) {
        Measured r;
        our_call(0);
        their_call(0);
        r.rdiff = max_rel_diff(y_ours, y_ref, size_t(nb) * s.n);
        auto g_ours = capture(stream, copies, our_call);
        auto g_theirs = capture(stream, copies, their_call);
        r.ms_ours = replay(g_ours, copies);
        r.ms_cublas = replay(g_theirs, copies);
        CUDA_CHECK(cudaGraphExecDestroy(g_ours));
        CUDA_CHECK(cudaGraphExecDestroy(g_theirs));
        return r;
      };
      Measured m = time_pair(ours, theirs);
      m.bytes = double(w_bytes) + double(nb) * s.k * 2 + double(nb) * s.n * 4;
      m.flops = 2.0 * s.n * s.k * nb;
      print_row(prefill ? (std::string(s.name) + " (pf)").c_str() : s.name, s.n, nb, m, ceiling);
      nlohmann::json rec = record_json(m, ceiling);
      rec.update({{"shape", s.name}, {"n", s.n}, {"k", s.k}, {"rows", nb}, {"k_splits", splits_r},
                  {"user", prefill ? "prefill" : "batched step"},
                  {"token_groups", cuda::gemm::dense_tile_groups(s.n, nb, splits_r, n_sms)}, {"weight_copies", copies}});
      dense.push_back(rec);
      if (prefill && std::string(s.name) == "o_proj") {
        // The prefill's O-proj adds the fp32 residual stream (Epilogue::kResidual); cuBLAS the same
        // with beta = 1 on a copy of the residual.
        float* res = nullptr;
        CUDA_CHECK(cudaMalloc(&res, size_t(nb) * s.n * 4));
        CUDA_CHECK(cudaMemcpy(res, y_ours, size_t(nb) * s.n * 4, cudaMemcpyDeviceToDevice));
        const float one = 1.0f;
        auto ours_res = [&](int c) { cuda::gemm::gemm(ours_args(c, res), cuda::gemm::Epilogue::kResidual, stream); };
        auto theirs_res = [&](int c) { cublas(c, &one); };
        CUDA_CHECK(cudaMemcpy(y_ref, res, size_t(nb) * s.n * 4, cudaMemcpyDeviceToDevice));
        Measured mr = time_pair(ours_res, theirs_res);
        CUDA_CHECK(cudaFree(res));
        mr.bytes = m.bytes + double(nb) * s.n * 4;
        mr.flops = m.flops;
        print_row("o_proj+res (pf)", s.n, nb, mr, ceiling);
        nlohmann::json rr = record_json(mr, ceiling);
        rr.update({{"shape", "o_proj+residual"}, {"n", s.n}, {"k", s.k}, {"rows", nb}, {"k_splits", 1},
                   {"user", "prefill"}, {"token_groups", cuda::gemm::dense_tile_groups(s.n, nb, 1, n_sms)},
                   {"weight_copies", copies}});
        dense.push_back(rr);
      }
    }
    for (int c = 0; c < copies; ++c) {
      CUDA_CHECK(cudaFree(packed[c]));
      CUDA_CHECK(cudaFree(rowmajor[c]));
    }
    for (void* p : {static_cast<void*>(x), static_cast<void*>(y_ours), static_cast<void*>(y_ref),
                    static_cast<void*>(split_ws), static_cast<void*>(split_sem)})
      CUDA_CHECK(cudaFree(p));
  }

  // ---- grouped: every expert of a layer with m rows each (gate/up with SwiGLU, then down) ----
  // Against cuBLAS as one call per expert (gate/up without the SwiGLU, fp32 out; down on our hidden).
  nlohmann::json grouped = nlohmann::json::array();
  const int E = 128, H = 2048, I = 768;
  const int64_t up_elems = cuda::packed_elements(2 * I, H), down_elems = cuda::packed_elements(H, I);
  const int64_t max_slots = *std::max_element(per_expert_list.begin(), per_expert_list.end()) * E;
  uint16_t *w_up = nullptr, *w_down = nullptr, *r_up = nullptr, *r_down = nullptr, *gx = nullptr, *hidden = nullptr;
  float *g_ours = nullptr, *g_ref = nullptr, *up_ref = nullptr;
  CUDA_CHECK(cudaMalloc(&w_up, up_elems * E * 2));
  CUDA_CHECK(cudaMalloc(&w_down, down_elems * E * 2));
  CUDA_CHECK(cudaMalloc(&r_up, size_t(2 * I) * H * E * 2));
  CUDA_CHECK(cudaMalloc(&r_down, size_t(H) * I * E * 2));
  CUDA_CHECK(cudaMalloc(&gx, size_t(max_slots) * H * 2));
  CUDA_CHECK(cudaMalloc(&hidden, size_t(max_slots) * I * 2));
  CUDA_CHECK(cudaMalloc(&g_ours, size_t(max_slots) * H * 4));
  CUDA_CHECK(cudaMalloc(&g_ref, size_t(max_slots) * H * 4));
  CUDA_CHECK(cudaMalloc(&up_ref, size_t(max_slots) * 2 * I * 4));
  fill_uniform(r_up, size_t(2 * I) * H * E, 4321, 7, 0.05f);
  fill_uniform(r_down, size_t(H) * I * E, 4321, 8, 0.05f);
  fill_uniform(gx, size_t(max_slots) * H, 77, 9, 1.0f);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int e = 0; e < E; ++e) {
    cuda::pack_weight(r_up + size_t(2 * I) * H * e, w_up + up_elems * e, 2 * I, H, stream);
    cuda::pack_weight(r_down + size_t(H) * I * e, w_down + down_elems * e, H, I, stream);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::printf("\ngrouped expert GEMMs, %d experts x m rows (gate/up %dx%d with SiLU*up, then down %dx%d)\n", E, 2 * I, H,
              H, I);
  std::printf("%-15s %6s %5s | %9s %8s %6s %6s | %9s %8s %6s %6s | %7s %9s\n", "gemm", "tile", "m", "ours us", "GB/s",
              "%ceil", "TF/s", "cublas us", "GB/s", "%ceil", "TF/s", "speedup", "max rdiff");
  for (int64_t m64 : per_expert_list) {
    const int m = static_cast<int>(m64), n_slots = m * E;
    const int tg = cuda::gemm::grouped_token_groups(n_slots, E);
    const int cap = cuda::gemm::moe_tile_capacity(n_slots, E, 8 * tg);
    std::vector<int32_t> counts(E, m), offsets(E + 1);
    std::vector<cuda::gemm::MoeTile> tiles(cap);
    const int n_tiles = cuda::gemm::build_moe_tiles(counts.data(), E, 8 * tg, offsets.data(), tiles.data(), cap);
    MD_CHECK(n_tiles > 0);
    cuda::gemm::MoeTile* d_tiles = nullptr;
    int32_t* d_n = nullptr;
    CUDA_CHECK(cudaMalloc(&d_tiles, cap * sizeof(cuda::gemm::MoeTile)));
    CUDA_CHECK(cudaMalloc(&d_n, 4));
    CUDA_CHECK(cudaMemcpy(d_tiles, tiles.data(), cap * sizeof(cuda::gemm::MoeTile), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_n, &n_tiles, 4, cudaMemcpyHostToDevice));
    cuda::gemm::GemmArgs up;
    up.w = w_up;
    up.w_expert_stride = up_elems;
    up.n_experts = E;
    up.n_rows = 2 * I;
    up.k = H;
    up.x = gx;
    up.x_stride = H;
    up.tiles = d_tiles;
    up.n_tiles = d_n;
    up.tile_capacity = cap;
    up.token_groups = tg;
    up.x_rows = n_slots;
    up.y = hidden;
    up.y_stride = I;
    cuda::gemm::GemmArgs dn = up;
    dn.w = w_down;
    dn.w_expert_stride = down_elems;
    dn.n_rows = H;
    dn.k = I;
    dn.x = hidden;
    dn.x_stride = I;
    dn.y = g_ours;
    dn.y_stride = H;
    auto ours_up = [&](int) { cuda::gemm::gemm(up, cuda::gemm::Epilogue::kSwiGlu, stream); };
    auto ours_down = [&](int) { cuda::gemm::gemm(dn, cuda::gemm::Epilogue::kStore, stream); };
    auto cublas_up = [&](int) {
      for (int e = 0; e < E; ++e)
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, m, H, &alpha, r_up + size_t(2 * I) * H * e,
                                  CUDA_R_16BF, H, gx + size_t(m) * e * H, CUDA_R_16BF, H, &beta,
                                  up_ref + size_t(m) * e * 2 * I, CUDA_R_32F, 2 * I, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    };
    auto cublas_down = [&](int) {
      for (int e = 0; e < E; ++e)
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, H, m, I, &alpha, r_down + size_t(H) * I * e,
                                  CUDA_R_16BF, I, hidden + size_t(m) * e * I, CUDA_R_16BF, I, &beta,
                                  g_ref + size_t(m) * e * H, CUDA_R_32F, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    ours_up(0);
    ours_down(0);
    cublas_down(0);
    const double rdiff_down = max_rel_diff(g_ours, g_ref, size_t(n_slots) * H);
    struct Part {
      const char* name;
      std::function<void(int)> ours, theirs;
      double w_bytes, x_bytes, y_bytes, flops, rdiff;
    };
    const Part parts[] = {
        {"expert_gate_up", ours_up, cublas_up, double(E) * 2 * I * H * 2, double(n_slots) * H * 2,
         double(n_slots) * I * 2, 2.0 * n_slots * 2 * I * H, -1.0},
        {"expert_down", ours_down, cublas_down, double(E) * H * I * 2, double(n_slots) * I * 2,
         double(n_slots) * H * 4, 2.0 * n_slots * H * I, rdiff_down}};
    for (const Part& p : parts) {
      Measured ms;
      auto go = capture(stream, 1, p.ours);
      auto gt = capture(stream, 1, p.theirs);
      ms.ms_ours = replay(go, 1);
      ms.ms_cublas = replay(gt, 1);
      CUDA_CHECK(cudaGraphExecDestroy(go));
      CUDA_CHECK(cudaGraphExecDestroy(gt));
      ms.bytes = p.w_bytes + p.x_bytes + p.y_bytes;
      ms.flops = p.flops;
      ms.rdiff = p.rdiff;
      print_row(p.name, 8 * tg, m, ms, ceiling);
      nlohmann::json rec = record_json(ms, ceiling);
      rec.update({{"shape", p.name}, {"experts", E}, {"rows_per_expert", m}, {"token_groups", tg},
                  {"tile_columns", n_tiles}});
      if (p.rdiff < 0) rec.erase("max_rel_diff_vs_cublas");  // cuBLAS has no SwiGLU epilogue: times only
      grouped.push_back(rec);
    }
    CUDA_CHECK(cudaFree(d_tiles));
    CUDA_CHECK(cudaFree(d_n));
  }
  for (void* p : {static_cast<void*>(w_up), static_cast<void*>(w_down), static_cast<void*>(r_up),
                  static_cast<void*>(r_down), static_cast<void*>(gx), static_cast<void*>(hidden),
                  static_cast<void*>(g_ours), static_cast<void*>(g_ref), static_cast<void*>(up_ref)})
    CUDA_CHECK(cudaFree(p));
  CUBLAS_CHECK(cublasDestroy(handle));
  CUDA_CHECK(cudaFree(cublas_ws));
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (args.has("json"))
    write_json(args.get("json", ""), {{"bench", "gemm"}, {"device", device_json()}, {"ceiling_gbps", ceiling},
                                      {"ceiling_configs", ceiling_cfg}, {"reps", reps}, {"dense", dense},
                                      {"grouped", grouped}, {"command", "megadecode bench gemm"}});
  return 0;
}

}  // namespace megadecode
