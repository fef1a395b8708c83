// `megadecode bench decode`: decode speed against the bandwidth floor, in one process on one GPU.
// 1. the pure-read ceiling (bandwidth kernel); 2. synthetic full-shape weights generated on the
// device (near-uniform routing); 3. per backend (cuda-mk, then cuda-ops), a KV cache filled with
// N(0, 0.01) and, per (context, batch), the median of >= --steps replays of one decode step
// (CUDA events around the graph), the bytes that step had to read (distinct experts read back
// from the routing it produced) and % of the floor; 4. optional ablations and a per-SM trace.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/decode_bytes.h"
#include "bench/decode_report.h"
#include "bench/decode_trace.h"
#include "cli/args.h"
#include "core/check.h"
#include "core/rng.h"
#include "model/presets.h"
#include "plan/policy.h"

#if defined(MEGADECODE_HAVE_CUDA)
#include "bench/decode_gpu.h"
#include "cuda/mk/mk_types.h"
#endif

namespace megadecode {

#if !defined(MEGADECODE_HAVE_CUDA)
int bench_decode(int, char**) { throw Error("bench decode: this build has no CUDA support"); }
#else
namespace {

constexpr int64_t kReserveBytes = int64_t{2} << 30;  // arena, plan, graphs, CUDA context slack

const char* kUsage =
    "usage: megadecode bench decode [--preset qwen3-30b-a3b] [--context 8192[,L2..]] [--batch 1,2,4,8,16,32,64]\n"
    "         [--points CTX:B,...] [--steps 100] [--warmup 10] [--backends mk,ops] [--policy default]\n"
    "         [--ablations] [--ablation-batch 1,8] [--trace FILE] [--trace-batch 1] [--json FILE]\n"
    "         [--seed S] [--kv-block-size 16] [--ceiling-mib 4096]\n"
    "  Measures the read ceiling, then each backend at every (context, batch) of the grid plus --points.\n"
    "  --ablations: plan policies, weight prefetch off, static queues, cuda-ops, at --ablation-batch and the\n"
    "  first context. --trace: a Chrome/Perfetto trace of one cuda-mk step (--trace-batch, first context).\n";

struct Variant {
  std::string name;
  bool per_op;
  std::string policy;
  uint32_t flags;
};

std::vector<Variant> ablation_variants() {
  std::vector<Variant> v;
  for (const std::string& p : policy_names()) v.push_back({p, false, p, 0});
  v.push_back({"no-prefetch", false, "default", cuda::kMkNoPrefetch});
  v.push_back({"static-queues", false, "default", cuda::kMkStaticQueues});
  v.push_back({"cuda-ops", true, "default", 0});
  return v;
}

int64_t blocks_for(int batch, int context, int bs) { return int64_t{batch} * ((context + bs - 1) / bs); }

void write_json(const std::string& path, const nlohmann::json& j, int indent) {
  std::ofstream out(path);
  MD_REQUIRE(out.good(), "cannot write ", path);
  out << j.dump(indent) << "\n";
  MD_REQUIRE(out.good(), "error writing ", path);
}

}  // namespace

int bench_decode(int argc, char** argv) {
  Args args(argc, argv,
            {"preset", "context", "batch", "points", "steps", "warmup", "backends", "policy", "ablation-batch",
             "trace", "trace-batch", "json", "seed", "kv-block-size", "ceiling-mib"},
            {"ablations", "help"});
  if (args.flag("help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  const ModelConfig config = preset_config(args.get("preset", "qwen3-30b-a3b"));
  const std::vector<int64_t> contexts = args.get_int_list("context", {8192});
  const std::vector<int64_t> batches = args.get_int_list("batch", {1, 2, 4, 8, 16, 32, 64});
  std::vector<std::pair<int, int>> points;
  for (int64_t ctx : contexts)
    for (int64_t b : batches) points.push_back({static_cast<int>(ctx), static_cast<int>(b)});
  for (const auto& pt : parse_points(args.get("points", ""))) points.push_back(pt);
  const int steps = static_cast<int>(args.get_int("steps", 100));
  const int warmup = static_cast<int>(args.get_int("warmup", 10));
  const int bs = static_cast<int>(args.get_int("kv-block-size", 16));
  const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 1));  // fixed: runs are comparable
  const std::string policy = args.get("policy", "default");
  (void)policy_by_name(policy);  // Error naming the known ones
  const std::vector<int64_t> ablation_batches = args.get_int_list("ablation-batch", {1, 8});
  const int trace_batch = static_cast<int>(args.get_int("trace-batch", 1));
  const int64_t ceiling_mib = args.get_int("ceiling-mib", 4096);
  bool run_mk = false, run_ops = false;
  {
    const std::string list = args.get("backends", "mk,ops");
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t end = list.find(',', pos);
      if (end == std::string::npos) end = list.size();
      const std::string b = list.substr(pos, end - pos);
      if (b == "mk" || b == "cuda-mk") run_mk = true;
      else if (b == "ops" || b == "cuda-ops") run_ops = true;
      else throw Error(cat("--backends: unknown backend \"", b, "\" (known: mk, ops)"));
      pos = end + 1;
    }
  }
  MD_REQUIRE(steps >= 1 && steps <= 100000 && warmup >= 0 && warmup <= 10000, "--steps ", steps, " / --warmup ",
             warmup, " out of range");
  MD_REQUIRE(bs >= 1 && bs <= 1024, "--kv-block-size must be in 1..1024, got ", bs);
  MD_REQUIRE(ceiling_mib >= 64 && ceiling_mib <= 65536, "--ceiling-mib must be in 64..65536");
  MD_REQUIRE(!points.empty(), "nothing to measure: give --batch/--context or --points");
  for (const auto& [ctx, b] : points) {
    MD_REQUIRE(b >= 1 && b <= 64, "batch ", b, ": the CUDA backends run 1..64 sequences");
    MD_REQUIRE(ctx >= 1 && ctx <= config.max_position_embeddings, "context ", ctx, " outside 1..",
               config.max_position_embeddings, " (the model's max_position_embeddings)");
  }
  for (int64_t b : ablation_batches) MD_REQUIRE(b >= 1 && b <= 64, "--ablation-batch ", b, " outside 1..64");
  MD_REQUIRE(trace_batch >= 1 && trace_batch <= 64, "--trace-batch ", trace_batch, " outside 1..64");

  // Memory: weights + the largest KV cache any backend of this run holds (one backend at a time).
  const int64_t block_bytes = kv_bytes_per_token(config) * bs;
  int64_t main_blocks = 0;
  for (const auto& [ctx, b] : points) main_blocks = std::max(main_blocks, blocks_for(b, ctx, bs));
  main_blocks = std::max(main_blocks, blocks_for(trace_batch, points.front().first, bs));
  int64_t ablation_blocks = 0;
  for (int64_t b : ablation_batches) ablation_blocks = std::max(ablation_blocks, blocks_for(b, points.front().first, bs));
  const GpuInfo gpu = gpu_info();
  const int64_t weights = model_weight_bytes(config);
  const int64_t kv_max = std::max(main_blocks, args.flag("ablations") ? ablation_blocks : 0) * block_bytes;
  const int64_t need = weights + kv_max + kReserveBytes;
  if (need > gpu.free_bytes) {
    std::string worst;
    for (const auto& [ctx, b] : points)
      if (weights + blocks_for(b, ctx, bs) * block_bytes + kReserveBytes > gpu.free_bytes)
        worst += cat(" batch ", b, " x context ", ctx, " (KV ", blocks_for(b, ctx, bs) * block_bytes >> 20, " MiB);");
    throw Error(cat("bench decode: does not fit on ", gpu.name, ": weights ", weights >> 20, " MiB + KV cache ",
                    kv_max >> 20, " MiB + ", kReserveBytes >> 20, " MiB reserve > ", gpu.free_bytes >> 20,
                    " MiB free.", worst.empty() ? "" : " Too large:" + worst, " Drop those points."));
  }

  std::printf("bench decode: %s (%d SMs, %.1f GB free), preset %s, steps %d (warm-up %d), seed %llu\n",
              gpu.name.c_str(), gpu.n_sms, gpu.free_bytes / 1e9, args.get("preset", "qwen3-30b-a3b").c_str(), steps,
              warmup, static_cast<unsigned long long>(seed));
  nlohmann::json ceiling_records = nlohmann::json::array();
  const int64_t ceiling_bytes = std::min<int64_t>(ceiling_mib << 20, (gpu.free_bytes - weights) / 2) / 16 * 16;
  const double ceiling = measure_read_ceiling(ceiling_bytes, 20, ceiling_records);
  std::printf("read ceiling: %.1f GB/s (best of %zu launch shapes over %lld MiB)\n", ceiling, ceiling_records.size(),
              static_cast<long long>(ceiling_bytes >> 20));
  std::fflush(stdout);

  DecodeGpu dev(config, seed);
  auto measure = [&](const Variant& v, int ctx, int b, int trace_capacity, DecodePointResult* keep) {
    DecodePointResult res = dev.run(b, ctx, warmup, steps, trace_capacity);
    DecodePoint p;
    p.backend = v.per_op ? "cuda-ops" : "cuda-mk";
    p.policy = v.policy;
    p.kernel_flags = v.flags;
    p.batch = b;
    p.context = ctx;
    p.n_sms = res.n_sms;
    p.ceiling_gbps = ceiling;
    p.step_ms = res.step_ms;
    p.distinct_experts = res.distinct_experts;
    p.bytes = decode_step_bytes(config, res.context_lens, res.distinct_experts);
    if (keep) *keep = std::move(res);
    return p;
  };

  nlohmann::json records = nlohmann::json::array(), ablations = nlohmann::json::array();
  nlohmann::json trace_summary;
  std::vector<Variant> mains;
  if (run_mk) mains.push_back({"cuda-mk", false, policy, 0});
  if (run_ops) mains.push_back({"cuda-ops", true, policy, 0});
  for (const Variant& v : mains) {
    dev.open({v.per_op, v.policy, v.flags, bs, main_blocks});
    for (const auto& [ctx, b] : points) {
      nlohmann::json r = decode_record(measure(v, ctx, b, 0, nullptr));
      std::printf("  %-8s batch %2d context %6d: %8.3f ms  %8.1f tok/s  %5.1f%% of floor\n", v.name.c_str(), b, ctx,
                  r["step_ms"].get<double>(), r["tok_s"].get<double>(), r["pct_of_floor"].get<double>());
      std::fflush(stdout);
      records.push_back(std::move(r));
    }
    if (!v.per_op && args.has("trace")) {
      DecodePointResult res;
      const int ctx = points.front().first;
      nlohmann::json r = decode_record(measure(v, ctx, trace_batch, 32768, &res));
      nlohmann::json meta = {{"backend", "cuda-mk"}, {"batch", trace_batch}, {"context", ctx},
                             {"policy", v.policy}, {"device", gpu.name}, {"step_ms_untraced", r["step_ms"]}};
      TraceSummary sum;
      write_json(args.get("trace", ""), trace_to_chrome(res.trace, res.plan, res.trace_dropped, meta, &sum), -1);
      std::printf("%s", format_trace_summary(sum).c_str());
      std::printf("trace of one cuda-mk step (batch %d, context %d) written to %s\n", trace_batch, ctx,
                  args.get("trace", "").c_str());
      trace_summary = {{"step_us", sum.step_us}, {"busy_frac", sum.busy_frac}, {"wait_frac", sum.wait_frac},
                       {"idle_frac", sum.idle_frac}, {"busy_us_by_op", sum.busy_us}, {"stall_us_by_op", sum.stall_us}};
    }
  }
  dev.close();
  const std::vector<nlohmann::json> rows(records.begin(), records.end());
  std::printf("\n%s", format_decode_table("decode steps (median of " + std::to_string(steps) + ")", rows).c_str());

  if (args.flag("ablations")) {
    const int ctx = points.front().first;
    for (const Variant& v : ablation_variants()) {
      dev.open({v.per_op, v.policy, v.flags, bs, ablation_blocks});
      for (int64_t b : ablation_batches) {
        DecodePoint p = measure(v, ctx, static_cast<int>(b), 0, nullptr);
        p.ablation = v.name;
        ablations.push_back(decode_record(p));
      }
      dev.close();
    }
    std::vector<nlohmann::json> sorted(ablations.begin(), ablations.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const nlohmann::json& a, const nlohmann::json& b) { return a["batch"] < b["batch"]; });
    std::printf("\n%s", format_decode_table("ablations (context " + std::to_string(ctx) + ")", sorted).c_str());
  }

  if (args.has("json")) {
    nlohmann::json out = {{"device", gpu.name}, {"n_sms", gpu.n_sms}, {"preset", args.get("preset", "qwen3-30b-a3b")},
                          {"seed", seed}, {"steps", steps}, {"warmup", warmup}, {"kv_block_size", bs},
                          {"ceiling_gbps", ceiling}, {"ceiling_shapes", ceiling_records}, {"records", records},
                          {"ablations", ablations}};
    if (!trace_summary.is_null()) out["trace_summary"] = trace_summary;
    std::string cmd = "megadecode bench decode";
    for (int i = 0; i < argc; ++i) cmd += std::string(" ") + argv[i];
    out["command"] = cmd;
    write_json(args.get("json", ""), out, 1);
    std::printf("records written to %s\n", args.get("json", "").c_str());
  }
  return 0;
}
#endif

}  // namespace megadecode
