// `megadecode bench prefill`, host side: flags and their checks, and the flop count of a piece.
// The run is defined with the CUDA code (src/bench/gpu/prefill_run.cu); a build
// without CUDA gets the Error below.
#include <algorithm>
#include <cstdio>

#include "bench/bench.h"
#include "bench/prefill_options.h"
#include "core/args.h"
#include "core/check.h"
#include "model/presets.h"

namespace megadecode {

const char* const kPrefillBenchUsage =
    "usage: megadecode bench prefill [--preset qwen3-30b-a3b] [--lengths 1024,8192,16384] [--prefill-chunk 8192]\n"
    "         [--reps 3] [--warmup 1] [--seed S] [--block-size 16] [--one-token] [--json FILE]\n"
    "  Prefills one prompt of random tokens per length with the GPU prefill kernels (random weights\n"
    "  generated on the device), in pieces of --prefill-chunk tokens; reports ms per piece, tokens/s and\n"
    "  TFLOP/s. --one-token also times the one-token decode path on the first length.\n";

PrefillBenchOptions parse_prefill_bench_args(int argc, char** argv) {
  Args args(argc, argv, {"preset", "lengths", "prefill-chunk", "reps", "warmup", "seed", "block-size", "json"},
            {"one-token", "help"});
  PrefillBenchOptions o;
  o.help = args.flag("help");
  o.command = "megadecode bench prefill";
  for (int i = 0; i < argc; ++i) o.command += std::string(" ") + argv[i];
  o.preset = args.get("preset", o.preset);
  o.config = preset_config(o.preset);
  o.lengths.clear();
  for (int64_t n : args.get_int_list("lengths", {1024, 8192, 16384})) {
    MD_REQUIRE(n >= 1 && n <= (1 << 20), "--lengths: ", n, " outside 1..", 1 << 20);
    o.lengths.push_back(static_cast<int>(n));
  }
  MD_REQUIRE(!o.lengths.empty(), "--lengths: give at least one prompt length");
  o.backend.prefill_chunk = args.get_int32("prefill-chunk", o.backend.prefill_chunk);
  o.backend.kv_block_size = args.get_int32("block-size", o.backend.kv_block_size);
  check_backend_options(o.backend);
  MD_REQUIRE(o.backend.prefill_chunk >= 1,
             "--prefill-chunk must be >= 1: bench prefill times the prefill kernels (--one-token: the decode path)");
  const int64_t reps = args.get_int("reps", o.reps), warmup = args.get_int("warmup", o.warmup);
  MD_REQUIRE(reps >= 1 && reps <= 1000, "--reps must be in 1..1000, got ", reps);
  MD_REQUIRE(warmup >= 0 && warmup <= 100, "--warmup must be in 0..100, got ", warmup);
  o.reps = static_cast<int>(reps);
  o.warmup = static_cast<int>(warmup);
  o.seed = static_cast<uint64_t>(args.get_int("seed", 1));
  o.one_token = args.flag("one-token");
  o.json_path = args.get("json", "");
  // Longer prompts than the checkpoint declares only raise the limit: the work per token does not
  // depend on the RoPE variant (as in bench decode).
  const int longest = *std::max_element(o.lengths.begin(), o.lengths.end());
  o.config.max_position_embeddings = std::max(o.config.max_position_embeddings, longest + 1);
  return o;
}

double prefill_attention_flops(const ModelConfig& c, int64_t start, int64_t n) {
  // Keys attended by positions start..start+n-1: sum of (pos + 1), or, a sliding layer of window
  // W, sum of min(pos + 1, W).
  auto keys_below = [](int64_t end, int64_t window) {  // sum over pos in [0, end) of min(pos + 1, window)
    if (window <= 0 || end <= window) return static_cast<double>(end) * (end + 1) / 2.0;
    return static_cast<double>(window) * (window + 1) / 2.0 + static_cast<double>(end - window) * window;
  };
  double keys = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int64_t w = c.layers[l].sliding_window;
    keys += keys_below(start + n, w) - keys_below(start, w);
  }
  return 2.0 * 2.0 * c.n_heads * c.head_dim * keys;
}

double prefill_flops(const ModelConfig& c, int64_t start, int64_t n) {
  const double H = c.hidden_size, nq = c.q_size(), nkv = c.kv_size();
  double per_token = 0;  // every layer's projections and FFN, a token
  for (int l = 0; l < c.n_layers; ++l) {
    per_token += 2.0 * (H * (nq + 2 * nkv) + nq * H);
    per_token += c.is_moe_layer(l) ? 2.0 * (H * c.n_experts + c.n_experts_per_tok * 3.0 * H * c.moe_intermediate_size)
                                   : 2.0 * 3.0 * H * c.intermediate_size;
  }
  return per_token * static_cast<double>(n) + prefill_attention_flops(c, start, n) + 2.0 * H * c.vocab_size;
}

#if !defined(MEGADECODE_HAVE_CUDA)
int bench_prefill(int argc, char** argv) {
  const PrefillBenchOptions o = parse_prefill_bench_args(argc, argv);
  if (o.help) {
    std::printf("%s", kPrefillBenchUsage);
    return 0;
  }
  throw Error("bench prefill: this build has no CUDA support");
}
#endif

}  // namespace megadecode
