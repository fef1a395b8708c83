// `megadecode bench decode`, host side: flags, their checks and the memory plan of the run. The
// run (read ceiling, cuda-mk, cuda-ops, ablations, trace) is defined with the CUDA code in
// src/bench/gpu/decode_run.cu, as `bench bandwidth` and `bench gemm` are, so this library
// object never refers to the CUDA library; a build without CUDA gets the Error below.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/decode_bytes.h"
#include "bench/decode_options.h"
#include "bench/decode_report.h"
#include "core/args.h"
#include "core/check.h"
#include "cuda/megakernel/flags.h"
#include "kv/kv_cache.h"
#include "engine/kv_pools.h"
#include "model/presets.h"
#include "plan/policy.h"

namespace megadecode {

const char* const kDecodeBenchUsage =
    "usage: megadecode bench decode [--preset qwen3-30b-a3b] [--context 8192[,L2..]] [--batch 1,2,4,8,16,32,64]\n"
    "         [--points CTX:B,...] [--steps 100] [--warmup 10] [--backends mk,ops,batched,cuda] [--policy default]\n"
    "         [--ablations] [--ablation-batch 1,8] [--trace FILE] [--trace-batch 1] [--json FILE]\n"
    "         [--seed S] [--block-size 16] [--ceiling-mib 4096] [--switches NAME,...]\n"
    "  Measures the read ceiling, then each backend at every (context, batch) of the grid plus --points:\n"
    "  mk (cuda-mk) and ops (cuda-ops) at batches <= 64, batched (cuda-batched) and cuda (the engine's\n"
    "  per-step choice of the two paths) at every batch up to 1024.\n"
    "  --ablations: at --ablation-batch and the first context, one change each to --policy and --switches:\n"
    "  none, every other plan policy, every switch not on (an inflight cap replaces one), none of the\n"
    "  switches, cuda-ops.\n"
    "  --trace: a Chrome/Perfetto trace of one cuda-mk step (--trace-batch, first context).\n"
    "  --switches: megakernel switches for the main sweep and the trace (cuda/megakernel/flags.h: loader-in-order,\n"
    "  l2-prefetch, poll-backoff, kv-prefetch, inflight-2, inflight-3, inflight-off, sample-full-pass,\n"
    "  down-split-k, experts-uncapped, down-uncapped, experts-uncapped-late; the default cap is 1).\n";

namespace {

int64_t blocks_for(int batch, int context, int bs) { return int64_t{batch} * ((context + bs - 1) / bs); }

// {"inflight-2", "kv-prefetch"} -> their MkFlag bits.
uint32_t mk_switch_flags(const std::vector<std::string>& names) {
  uint32_t flags = 0;
  for (const std::string& name : names) {
    std::string known;
    bool found = false;
    for (const cuda::MkSwitch& sw : cuda::kMkSwitches) {
      known += known.empty() ? sw.name : std::string(", ") + sw.name;
      if (name == sw.name) {
        flags |= sw.flag;
        found = true;
      }
    }
    MD_REQUIRE(found, "--switches: unknown switch \"", name, "\" (known: ", known, ")");
  }
  return flags;
}

}  // namespace

int64_t DecodeBenchOptions::block_bytes() const {
  return kv_pool_shape(config, backend.kv_block_size, 2).full_block_bytes;
}

int64_t DecodeBenchOptions::main_blocks() const {
  int64_t n = blocks_for(trace_batch, points.front().first, backend.kv_block_size);
  for (const auto& [ctx, b] : points) n = std::max(n, blocks_for(b, ctx, backend.kv_block_size));
  return n;
}

int64_t DecodeBenchOptions::ablation_blocks() const {
  int64_t n = 0;
  for (int b : ablation_batches) n = std::max(n, blocks_for(b, points.front().first, backend.kv_block_size));
  return n;
}

int64_t DecodeBenchOptions::ring_blocks() const {
  const int window = config.max_sliding_window();
  if (window == 0) return 0;
  // A point's sequences hold min(R, their blocks) ring blocks each (bench/gpu/decode_gpu.cu): the
  // largest point's need, the traced and the ablation points (first context) included.
  const int bs = backend.kv_block_size;
  const int64_t R = kv_ring_length(window, bs);
  auto need = [&](int batch, int ctx) { return int64_t{batch} * std::min<int64_t>(R, (ctx + bs - 1) / bs); };
  int64_t n = need(trace_batch, points.front().first);
  for (const auto& [ctx, b] : points) n = std::max(n, need(b, ctx));
  if (ablations)
    for (int b : ablation_batches) n = std::max(n, need(b, points.front().first));
  return n;
}

int64_t DecodeBenchOptions::ring_block_bytes() const {
  return kv_pool_shape(config, backend.kv_block_size, 2).ring_block_bytes;
}

DecodeBenchOptions parse_decode_bench_args(int argc, char** argv) {
  Args args(argc, argv,
            {"preset", "context", "batch", "points", "steps", "warmup", "backends", "policy", "ablation-batch",
             "trace", "trace-batch", "json", "seed", "block-size", "ceiling-mib", "switches"},
            {"ablations", "help"});
  DecodeBenchOptions o;
  o.help = args.flag("help");
  o.command = "megadecode bench decode";
  for (int i = 0; i < argc; ++i) o.command += std::string(" ") + argv[i];
  o.preset = args.get("preset", o.preset);
  o.config = preset_config(o.preset);
  for (int64_t ctx : args.get_int_list("context", {8192}))
    for (int64_t b : args.get_int_list("batch", {1, 2, 4, 8, 16, 32, 64}))
      o.points.push_back({static_cast<int>(std::clamp<int64_t>(ctx, -1, 1 << 30)),
                          static_cast<int>(std::clamp<int64_t>(b, -1, 1 << 30))});
  for (const auto& pt : parse_points(args.get("points", ""))) o.points.push_back(pt);
  const int64_t steps = args.get_int("steps", o.steps), warmup = args.get_int("warmup", o.warmup);
  MD_REQUIRE(steps >= 1 && steps <= 100000, "--steps must be in 1..100000, got ", steps);
  MD_REQUIRE(warmup >= 0 && warmup <= 10000, "--warmup must be in 0..10000, got ", warmup);
  o.steps = static_cast<int>(steps);
  o.warmup = static_cast<int>(warmup);
  o.backend.kv_block_size = args.get_int32("block-size", o.backend.kv_block_size);
  check_backend_options(o.backend);
  o.seed = static_cast<uint64_t>(args.get_int("seed", 1));
  o.backend.policy = args.get("policy", o.backend.policy);
  (void)policy_by_name(o.backend.policy);  // Error naming the known ones
  o.backend.kernel_flags = mk_switch_flags(args.get_list("switches", {}));
  o.ablations = args.flag("ablations");
  o.ablation_batches.clear();
  for (int64_t b : args.get_int_list("ablation-batch", {1, 8})) {
    MD_REQUIRE(b >= 1 && b <= 64, "--ablation-batch ", b, " outside 1..64");
    o.ablation_batches.push_back(static_cast<int>(b));
  }
  o.trace_path = args.get("trace", "");
  const int64_t tb = args.get_int("trace-batch", 1);
  MD_REQUIRE(tb >= 1 && tb <= 64, "--trace-batch ", tb, " outside 1..64");
  o.trace_batch = static_cast<int>(tb);
  o.json_path = args.get("json", "");
  o.ceiling_mib = args.get_int("ceiling-mib", o.ceiling_mib);
  MD_REQUIRE(o.ceiling_mib >= 64 && o.ceiling_mib <= 65536, "--ceiling-mib must be in 64..65536, got ", o.ceiling_mib);
  o.backends.clear();
  const std::string list = args.get("backends", "mk,ops,batched,cuda");
  for (size_t pos = 0; pos <= list.size();) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string b = list.substr(pos, end - pos);
    const std::string full = b == "mk" ? "cuda-mk" : b == "ops" ? "cuda-ops" : b == "batched" ? "cuda-batched" : b;
    MD_REQUIRE(full == "cuda-mk" || full == "cuda-ops" || full == "cuda-batched" || full == "cuda",
               "--backends: unknown backend \"", b, "\" (known: mk, ops, batched, cuda)");
    if (std::find(o.backends.begin(), o.backends.end(), full) == o.backends.end()) o.backends.push_back(full);
    pos = end + 1;
  }
  MD_REQUIRE(!o.points.empty(), "nothing to measure: give --batch/--context or --points");
  int max_ctx = 0;
  for (const auto& [ctx, b] : o.points) {
    MD_REQUIRE(b >= 1 && b <= BackendOptions::kMaxBatch, "batch ", b, ": the CUDA backends run 1..",
               BackendOptions::kMaxBatch, " sequences (the megakernel's rows skip batches above ",
               kDecodeBenchMegakernelMaxBatch, ")");
    MD_REQUIRE(ctx >= 1 && ctx <= kDecodeBenchMaxContext, "context ", ctx, " outside 1..", kDecodeBenchMaxContext);
    max_ctx = std::max(max_ctx, ctx);
  }
  // Qwen3-30B-A3B declares 40960 positions and reaches 131072 with YaRN rope scaling. The step's
  // bytes and work do not depend on the rope variant, so longer benchmark contexts raise the
  // limit and keep plain RoPE (bench/gpu/decode_run.cu prints a note).
  o.config.max_position_embeddings = std::max(o.config.max_position_embeddings, max_ctx);
  return o;
}

std::string decode_memory_problem(const DecodeBenchOptions& o, int64_t free_bytes) {
  const int64_t weights = model_weight_bytes(o.config);
  const int64_t kv_max = std::max(o.main_blocks(), o.ablations ? o.ablation_blocks() : 0) * o.block_bytes() +
                         o.ring_blocks() * o.ring_block_bytes();
  if (weights + kv_max + kDecodeBenchReserveBytes <= free_bytes) return "";
  std::string worst;
  for (const auto& [ctx, b] : o.points) {
    const int64_t kv = blocks_for(b, ctx, o.backend.kv_block_size) * o.block_bytes();
    if (weights + kv + kDecodeBenchReserveBytes > free_bytes)
      worst += cat(" batch ", b, " x context ", ctx, " (KV ", kv >> 20, " MiB);");
  }
  return cat("weights ", weights >> 20, " MiB + KV cache ", kv_max >> 20, " MiB + ", kDecodeBenchReserveBytes >> 20,
             " MiB reserve > ", free_bytes >> 20, " MiB free.", worst.empty() ? "" : " Too large:" + worst,
             " Drop those points.");
}

#if !defined(MEGADECODE_HAVE_CUDA)
int bench_decode(int argc, char** argv) {
  const DecodeBenchOptions o = parse_decode_bench_args(argc, argv);
  if (o.help) {
    std::printf("%s", kDecodeBenchUsage);
    return 0;
  }
  throw Error("bench decode: this build has no CUDA support");
}
#endif

}  // namespace megadecode
