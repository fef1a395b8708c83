// `megadecode bench prefill` (CUDA builds): synthetic weights of the preset generated on the
// device, one CudaBackend with the prefill kernels (cuda-mk; prefill is the same for cuda-ops),
// one prompt of random tokens per length prefilled piece by piece (each piece one prefill() call
// at its start position, timed on the host around the synchronous call), then tokens/s, ms per
// piece and TFLOP/s; --json writes one record per length.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/prefill_options.h"
#include "core/check.h"
#include "core/json_file.h"
#include "core/rng.h"
#include "core/stats.h"
#include "core/stopwatch.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cuda_check.h"
#include "kv/kv_cache.h"

namespace megadecode {
namespace {

// Prefills `tokens` piece by piece; returns each piece's milliseconds.
std::vector<double> timed_prefill(cuda::CudaBackend& be, const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& table, const std::vector<int32_t>& ring, int piece,
                                  std::vector<float>& logits) {
  std::vector<double> ms;
  const int n = static_cast<int>(tokens.size());
  for (int b = 0; b < n; b += piece) {
    const int len = std::min(piece, n - b);
    SeqChunk c;
    c.tokens = std::span<const int32_t>(tokens).subspan(b, len);
    c.start_pos = b;
    c.block_table = table;
    c.ring_table = ring;
    const Stopwatch t0;
    be.prefill(c, b + len == n ? std::span<float>(logits) : std::span<float>());
    ms.push_back(t0.ms());
  }
  return ms;
}

}  // namespace

int bench_prefill(int argc, char** argv) {
  const PrefillBenchOptions o = parse_prefill_bench_args(argc, argv);
  if (o.help) {
    std::printf("%s", kPrefillBenchUsage);
    return 0;
  }
  const ModelConfig& c = o.config;
  const int longest = *std::max_element(o.lengths.begin(), o.lengths.end());
  const int bs = o.backend.kv_block_size, chunk = o.backend.prefill_chunk;
  const int n_blocks = (longest + bs - 1) / bs + 1;
  std::printf("bench prefill: %s, lengths", o.preset.c_str());
  for (int n : o.lengths) std::printf(" %d", n);
  std::printf(", pieces of %d tokens, %d reps (+%d warmup), seed %llu\n", chunk, o.reps, o.warmup,
              static_cast<unsigned long long>(o.seed));
  const Stopwatch t_w;
  std::shared_ptr<const cuda::DeviceWeights> weights = cuda::DeviceWeights::synthetic(c, o.seed);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("weights: %.2f GB generated on the device in %.1f s\n", static_cast<double>(weights->bytes()) / 1e9,
              t_w.seconds());
  BackendOptions bo = o.backend;
  bo.n_kv_blocks = n_blocks;
  // A model with sliding-window layers: one sequence's ring of the ring pool (kv/kv_cache.h).
  const int ring_len = kv_ring_length(c.max_sliding_window(), bs);
  bo.n_ring_blocks = ring_len;
  cuda::CudaBackend be(weights, bo);
  std::vector<int32_t> ring(ring_len);
  std::iota(ring.begin(), ring.end(), 0);

  SplitMix64 rng(o.seed ^ 0xbe7c4ull);
  std::vector<int32_t> table(n_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits(c.vocab_size);
  nlohmann::json records = nlohmann::json::array();
  std::printf("%8s %8s %12s %12s %12s %10s  %s\n", "tokens", "pieces", "total ms", "tokens/s", "TFLOP/s", "first ms",
              "ms per piece (median rep)");
  for (int n : o.lengths) {
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(c.vocab_size));
    for (int i = 0; i < o.warmup; ++i) timed_prefill(be, tokens, table, ring, chunk, logits);
    std::vector<std::vector<double>> reps;
    std::vector<double> totals;
    for (int i = 0; i < o.reps; ++i) {
      reps.push_back(timed_prefill(be, tokens, table, ring, chunk, logits));
      totals.push_back(std::accumulate(reps.back().begin(), reps.back().end(), 0.0));
    }
    const double total = median(totals);
    const size_t med_rep = static_cast<size_t>(std::find(totals.begin(), totals.end(), total) - totals.begin());
    const std::vector<double>& pieces = reps[med_rep];
    const double flops = prefill_flops(c, 0, n);
    const double tok_s = n / (total / 1e3), tflops = flops / (total / 1e3) / 1e12;
    std::printf("%8d %8zu %12.2f %12.0f %12.1f %10.2f ", n, pieces.size(), total, tok_s, tflops, pieces.front());
    for (double m : pieces) std::printf(" %.2f", m);
    std::printf("\n");
    // The whole prompt once more with an event after every launch: where its time goes.
    SeqChunk whole;
    whole.tokens = tokens;
    whole.block_table = table;
    whole.ring_table = ring;
    const std::vector<std::pair<std::string, double>> kernels = be.probe().profile_prefill(whole);
    nlohmann::json kernel_ms = nlohmann::json::object();
    std::printf("    kernels (ms, the whole prompt):");
    for (const auto& [name, ms] : kernels) {
      std::printf(" %s %.2f", name.c_str(), ms);
      kernel_ms[name] = ms;
    }
    std::printf("\n");
    // Attention per piece (each piece profiled alone, its prefix already in the cache): ms and
    // TFLOP/s of its causal attention flops (prefill_attention_flops).
    nlohmann::json attn_ms = nlohmann::json::array(), attn_tflops = nlohmann::json::array();
    std::printf("    attention per piece (ms, TFLOP/s):");
    for (int begin = 0; begin < n; begin += chunk) {
      SeqChunk piece;
      piece.tokens = std::span<const int32_t>(tokens).subspan(begin, std::min(chunk, n - begin));
      piece.start_pos = begin;
      piece.block_table = table;
      piece.ring_table = ring;
      double ms = 0;
      for (const auto& [name, k_ms] : be.probe().profile_prefill(piece))
        if (name == "attention") ms += k_ms;
      const double flops = prefill_attention_flops(c, begin, static_cast<int64_t>(piece.tokens.size()));
      attn_ms.push_back(ms);
      attn_tflops.push_back(flops / (ms / 1e3) / 1e12);
      std::printf(" %.2f (%.0f)", ms, attn_tflops.back().get<double>());
    }
    std::printf("\n");
    records.push_back({{"backend", "prefill-kernels"}, {"preset", o.preset}, {"tokens", n}, {"chunk", chunk},
                       {"total_ms", total}, {"tokens_per_s", tok_s}, {"tflops", tflops}, {"piece_ms", pieces},
                       {"ms_per_piece_mean", total / static_cast<double>(pieces.size())}, {"total_ms_reps", totals},
                       {"kernel_ms", kernel_ms}, {"attention_piece_ms", attn_ms},
                       {"attention_piece_tflops", attn_tflops}});
  }
  if (o.one_token) {
    // The baseline: the decode path one token per step, on the first length.
    BackendOptions so = bo;
    so.prefill_chunk = 0;
    cuda::CudaBackend slow(weights, so);
    const int n = o.lengths.front();
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(c.vocab_size));
    const std::vector<double> ms = timed_prefill(slow, tokens, table, ring, n, logits);
    std::printf("one-token path: %d tokens in %.1f ms (%.0f tokens/s)\n", n, ms.front(), n / (ms.front() / 1e3));
    records.push_back({{"backend", "one-token-decode-path"}, {"preset", o.preset}, {"tokens", n},
                       {"total_ms", ms.front()}, {"tokens_per_s", n / (ms.front() / 1e3)}});
  }
  if (!o.json_path.empty()) {
    nlohmann::json out = {{"command", o.command}, {"records", records}};
    write_json(o.json_path, out);
    std::printf("wrote %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace megadecode
